"""Webhooks: subscriptions that have the server POST the event log's events to a URL, in
sequence order, signed as Standard Webhooks, retried, and safe against SSRF
(docs/webhooks.md)."""
