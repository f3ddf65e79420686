"""``agents token create|list|revoke|rotate``: manage the principals of a server's token file."""

from __future__ import annotations

import argparse
import datetime
import pathlib
import sys
import time
from collections.abc import Sequence
from typing import Any

from cleveragents.acp.client.cli.options import env
from cleveragents.acp.contract.call import Role

# ``facade.auth`` (the token file's pydantic model) is imported by each command as it runs:
# every ``agents`` process imports this module to add the ``token`` parser.

# The commands this module adds (``main`` builds only these for a line naming one).
NAMES = ("token",)
_GRACE_DEFAULT = "1h"


def register(subparsers: argparse._SubParsersAction[Any], words: Sequence[str] | None = None) -> None:
    """Adds ``token`` and its verbs (small enough to build in full whatever ``words`` is)."""
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
    create.add_argument(
        "--role",
        choices=[str(role) for role in Role],
        default=str(Role.WRITER),
        help="reader: read-only operations; writer (default): every operation but registering or "
        "changing what runs a process; admin: everything (docs/security.md)",
    )
    _expires_option(create, "the token stops working after DURATION (default: never)")
    create.set_defaults(handler=create_command)

    listing = verbs.add_parser("list", help="show the principals of a token file (never tokens)")
    _tokens_option(listing)
    listing.set_defaults(handler=list_command)

    revoke = verbs.add_parser(
        "revoke",
        help="remove a principal: its token stops working, open streams end (within 2 s)",
    )
    _tokens_option(revoke)
    revoke.add_argument("name", help="the principal's name")
    revoke.set_defaults(handler=revoke_command)

    rotate = verbs.add_parser(
        "rotate",
        help="give a principal a fresh token, printed once; the old one works for a grace period",
    )
    _tokens_option(rotate)
    rotate.add_argument("name", help="the principal's name")
    rotate.add_argument(
        "--grace",
        default=_GRACE_DEFAULT,
        metavar="DURATION",
        help=f"how long the old token keeps working (default {_GRACE_DEFAULT}; 0s: not at all)",
    )
    _expires_option(rotate, "the new token stops working after DURATION (default: the old expiry)")
    rotate.set_defaults(handler=rotate_command)


def _tokens_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokens",
        type=pathlib.Path,
        default=env("ACP_TOKENS"),
        required=env("ACP_TOKENS") is None,
        metavar="FILE",
        help="the token file (env ACP_TOKENS)",
    )


def _expires_option(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--expires-in", metavar="DURATION", help=f"{text}; e.g. 90s, 15m, 12h, 30d")


def _fail(verb: str, exc: Exception) -> int:
    print(f"agents token {verb}: {exc}", file=sys.stderr)
    return 1


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "never"
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def create_command(args: argparse.Namespace) -> int:
    namespaces = None if args.all_namespaces else list(args.namespaces)
    from cleveragents.acp.facade import auth

    try:
        expires_in = None if args.expires_in is None else auth.parse_duration(args.expires_in)
        token = auth.create_token(args.tokens, args.name, namespaces, role=args.role, expires_in=expires_in)
    except auth.TokenFileError as exc:
        return _fail("create", exc)
    print(token)
    print(
        f"(principal {args.name!r} ({args.role}) added to {args.tokens}; the token is shown only now)",
        file=sys.stderr,
    )
    return 0


def list_command(args: argparse.Namespace) -> int:
    """One line per principal: name, namespaces, role, expiry (``expired`` once past)."""
    from cleveragents.acp.facade import auth

    try:
        entries = auth.load(args.tokens)
    except auth.TokenFileError as exc:
        return _fail("list", exc)
    now = time.time()
    for entry in entries:
        scope = "*" if entry.namespaces is None else ",".join(sorted(entry.namespaces))
        expiry = _when(entry.expires) + (" (expired)" if entry.expired(now) else "")
        line = f"{entry.name}\t{scope}\t{entry.role}\texpires={expiry}"
        if entry.previous_expires is not None and entry.previous_expires > now:
            line += f"\tprevious-token-until={_when(entry.previous_expires)}"
        print(line)
    return 0


def revoke_command(args: argparse.Namespace) -> int:
    from cleveragents.acp.facade import auth

    try:
        auth.revoke_token(args.tokens, args.name)
    except auth.TokenFileError as exc:
        return _fail("revoke", exc)
    print(
        f"(principal {args.name!r} removed from {args.tokens}; a running server refuses its token "
        f"within {auth.CHECK_SECONDS:g} s and ends its open streams)",
        file=sys.stderr,
    )
    return 0


def rotate_command(args: argparse.Namespace) -> int:
    from cleveragents.acp.facade import auth

    try:
        grace = 0.0 if args.grace.strip() in ("0", "0s") else auth.parse_duration(args.grace)
        expires_in = None if args.expires_in is None else auth.parse_duration(args.expires_in)
        token = auth.rotate_token(args.tokens, args.name, grace_seconds=grace, expires_in=expires_in)
    except auth.TokenFileError as exc:
        return _fail("rotate", exc)
    print(token)
    until = "no longer works" if grace == 0 else f"works for {args.grace.strip()} more"
    print(f"(principal {args.name!r} has a new token, shown only now; the old one {until})", file=sys.stderr)
    return 0
