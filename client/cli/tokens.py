"""``agents token create|list``: manage the principals of a server's token file."""

from __future__ import annotations

import argparse
import pathlib
import sys
from typing import Any

from cleveragents.acp.client.cli.options import env
from cleveragents.acp.facade import auth


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    token = subparsers.add_parser("token", help="manage bearer tokens of server mode")
    verbs = token.add_subparsers(dest="verb", metavar="VERB", required=True)

    create = verbs.add_parser(
        "create",
        help="add a principal with a fresh token, printed once",
        description="Adds a principal to the token file with a fresh random token and prints the "
        "token once: only its SHA-256 is stored. The file is created (mode 0600) if missing.",
    )
    _tokens_option(create)
    create.add_argument("--name", required=True, help="the principal's name")
    scope = create.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="a namespace the token may use (repeat for several)",
    )
    scope.add_argument("--all-namespaces", action="store_true", help="the token may use every namespace")
    create.set_defaults(handler=create_command)

    listing = verbs.add_parser("list", help="show the principals of a token file (never tokens)")
    _tokens_option(listing)
    listing.set_defaults(handler=list_command)


def _tokens_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokens",
        type=pathlib.Path,
        default=env("ACP_TOKENS"),
        required=env("ACP_TOKENS") is None,
        metavar="FILE",
        help="the token file (env ACP_TOKENS)",
    )


def create_command(args: argparse.Namespace) -> int:
    namespaces = None if args.all_namespaces else list(args.namespaces)
    try:
        token = auth.create_token(args.tokens, args.name, namespaces)
    except auth.TokenFileError as exc:
        print(f"agents token create: {exc}", file=sys.stderr)
        return 1
    print(token)
    print(
        f"(principal {args.name!r} added to {args.tokens}; the token is shown only now)",
        file=sys.stderr,
    )
    return 0


def list_command(args: argparse.Namespace) -> int:
    try:
        entries = auth.load(args.tokens)
    except auth.TokenFileError as exc:
        print(f"agents token list: {exc}", file=sys.stderr)
        return 1
    for entry in entries:
        scope = "*" if entry.namespaces is None else ",".join(sorted(entry.namespaces))
        print(f"{entry.name}\t{scope}")
    return 0
