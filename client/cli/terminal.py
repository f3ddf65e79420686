"""``agents tui``: the terminal client (``client/tui``), connected like every other command
(local mode, ``--server``/``--grpc``, ``--token``, profiles). Textual is imported only when
it runs, so no other command pays for it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from cleveragents.acp.client.cli.connect import ConfigError, add_options, resolve
from cleveragents.acp.client.cli.exits import EXIT_USAGE

NAMES = ("tui",)

EPILOG = """\
examples:
  agents tui                                     local mode (--db FILE or ACP_DB)
  agents tui --server http://127.0.0.1:8080 --token TOKEN
  agents tui --grpc 127.0.0.1:50051 --token TOKEN
  agents tui --profile prod

Keys: ? shows every key of the screen; s sessions, p plans, e events, r registries,
i approvals, q quits (docs/tui.md)."""


def register(subparsers: argparse._SubParsersAction[Any], words: Sequence[str] | None = None) -> None:
    parser = subparsers.add_parser(
        "tui",
        help="the terminal client: sessions, plans, events and registries, live",
        description="A full-screen terminal client over the same connection as the other commands.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(parser)
    parser.set_defaults(handler=run, connects=True)


def run(args: argparse.Namespace) -> int:
    try:
        conn = resolve(args)
    except ConfigError as exc:
        sys.stderr.write(f"agents: error: {exc}\n")
        return EXIT_USAGE
    from cleveragents.acp.client.cli.calls import open_client
    from cleveragents.acp.client.tui.app import ACPApp

    app = ACPApp(lambda: open_client(conn, notify=app.retrying), where=conn.where)
    app.run()
    return app.return_code or 0
