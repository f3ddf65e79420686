"""``agents``: the entry point. Each module in ``COMMANDS`` registers its subcommands.

A command module has ``register(subparsers)`` that adds its parsers and sets
``handler`` (``args -> exit status``) as a default; this file knows no command itself.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from types import ModuleType

from cleveragents.acp.client.cli import calls, serve, tokens

COMMANDS: tuple[ModuleType, ...] = (serve, tokens, calls)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agents",
        description="CleverAgents ACP: run the server, manage tokens, call operations.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(args, "log_level", "warning").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    status: int = args.handler(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
