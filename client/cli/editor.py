"""``agents editor``: a Zed ACP agent on stdin and stdout (Zed's Agent Client Protocol,
JSON-RPC; not our ACP), for editors to open sessions with (docs/editors.md). Connects like
every other command; only JSON-RPC is written to stdout, diagnostics go to stderr."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import Any

from cleveragents.acp.client.cli.connect import add_options

NAMES = ("editor",)

EPILOG = """\
An editor starts it and talks Zed ACP (JSON-RPC over stdio) to it: Zed's agent_servers,
JetBrains' acp.json, Neovim's CodeCompanion, acpx. Sessions are ACP sessions of the project
whose directory resource holds the editor's folder (project.resolve).

examples:
  agents editor                                         local mode, on --db or ACP_DB
  agents editor --server https://acp.example.com --token TOKEN
  agents editor --profile prod                          a profile of the config file
  acpx --agent 'agents editor' exec '/help'             try it from a terminal

docs/editors.md has each editor's configuration."""


def register(subparsers: Any, words: Sequence[str] | None = None) -> None:
    parser = subparsers.add_parser(
        "editor",
        help="a Zed ACP agent on stdio for editors (Zed, JetBrains, Neovim, acpx)",
        description="Speak Zed's Agent Client Protocol (Zed ACP, JSON-RPC over stdin/stdout) to an "
        "editor, over this connection's ACP sessions.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--orchestrator",
        metavar="ACTOR",
        default="",
        help="the orchestrator actor of the sessions it creates (default: the built-in orchestrator)",
    )
    add_options(parser)
    parser.set_defaults(handler=editor_command, connects=True)


def editor_command(args: argparse.Namespace) -> int:
    # Before anything can write to it: stdout is the JSON-RPC stream from here on.
    from cleveragents.acp.client.editor.stdio import claim_stdout

    rpc_fd = claim_stdout()
    from cleveragents.acp.client.cli import calls
    from cleveragents.acp.client.cli.connect import ConfigError, Connection, resolve
    from cleveragents.acp.client.cli.exits import EXIT_INTERRUPTED
    from cleveragents.acp.client.editor.run import serve

    conn = None

    async def run(conn: Connection) -> int:
        return await serve(calls.open_client(conn), conn.where, rpc_fd, orchestrator=args.orchestrator)

    try:
        conn = resolve(args)
        return asyncio.run(run(conn))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (ConfigError, calls.LocalStoreError, OSError) as exc:
        return calls.fail(exc, conn, sys.stderr)
