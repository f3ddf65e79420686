"""``agents tui``: the terminal client, built with Textual, over ``ACPClient`` only.

Screens: sessions, a session (history, streamed model text, prompt, cancel of a turn),
plans, a plan (status, tree, diff, explain, artifacts, actions), events, registries, and
the approvals inbox, whose pending count is in the header of every screen (docs/tui.md)."""
