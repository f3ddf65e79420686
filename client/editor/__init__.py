"""``agents editor``: a Zed ACP agent (Zed's Agent Client Protocol, JSON-RPC over stdio) over
``ACPClient``, so editors (Zed, JetBrains, Neovim, acpx...) open our sessions (docs/editors.md).

``agent`` maps the Zed ACP methods onto ACP operations; ``turns`` runs a prompt as a background
turn; ``plans`` shows a plan as a Zed ACP plan and tool calls; ``history`` replays a session;
``modes`` holds the modes and slash commands; ``permissions`` asks the person the server's
approval requests; ``stdio`` keeps stdout for JSON-RPC alone; ``errors`` turns ACP errors into JSON-RPC
ones. Imports only the client side (``ACPClient``, the contract) and the Zed ACP SDK.
"""
