"""``agents``: the entry point. Each command module registers its subcommands.

A command module has ``register(subparsers, words)`` that adds its parsers and sets
``handler`` (``args -> exit status``) as a default; this file knows no command itself.

Every test runs hundreds of ``agents`` processes, and building a parser for each of the
catalog's operations costs more than most calls: a parser is built for the command line it
parses. ``words`` (see ``command_words``) names the command and its verb; a module builds
those parsers in full and only the names and help lines of the others, which is all the
overview and an unknown command's error show. ``serve``, ``token`` and ``editor`` (``NAMES`` of
their modules) need no other module at all, so neither the catalog nor the client is imported.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import re
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NoReturn

from cleveragents.acp.client.cli import editor, exits, serve, terminal, tokens
from cleveragents.acp.client.cli.connect import add_options, given_globally
from cleveragents.acp.contract.errors import TABLE

_INVALID_CHOICE = re.compile(r"argument (?:COMMAND|VERB): invalid choice: '([^']*)'")
_MISSING_COMMAND = re.compile(r"the following arguments are required: (?:COMMAND|VERB)")


def epilog() -> str:
    codes = sorted(mapping.exit_code for mapping in TABLE.values())
    return f"""\
local mode (the default) runs in this process on a SQLite file: --db FILE or ACP_DB.
--server URL --token TOKEN (HTTP) or --grpc HOST:PORT talk to a server (`agents serve`).
Connection and output options go before or after the command.

examples:
  agents session create --title demo            create a session (local mode)
  agents session tell SESSION_ID /help          talk to its orchestrator
  agents resource add site --spec '{{"type": "directory", "path": "/srv/site"}}'
  agents action add --help                      the fields an action's --spec takes
  agents plan use ACTION PROJECT --inputs name=World --value plan.meta.id
  agents plan execute PLAN_ID --wait            run it; then plan diff, plan apply
  agents events watch --plan PLAN_ID --until-done
  agents plan list --json                       JSON of the response data, for scripts
  agents --server http://127.0.0.1:8080 --token TOKEN plan list
  agents serve --state-dir .acp                 run the server, printing a token (docs/server.md)

exit status: 0 success, {exits.EXIT_PLAN_FAILED} the plan a --wait waited for failed or was cancelled,
2 bad usage, {codes[0]}-{codes[-1]} one per ACP error code, {exits.EXIT_UNREACHABLE} server unreachable,
{exits.EXIT_AWAITING_APPROVAL} the plan a --wait waited for awaits an approval (the question on stderr),
{exits.EXIT_INTERRUPTED} interrupted (docs/cli.md)."""


class Parser(argparse.ArgumentParser):
    """Reports a mistake in the (sub)command that has it, with that command's usage: an
    unknown argument, an unknown command (with a suggestion), a missing one (with the help).
    Flags are never abbreviated: a field added later must not change what one meant."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        # Kept for error(): a missing required flag may be a mistyped one among these.
        self._given = list(args) if args is not None else sys.argv[1:]
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._suggest(extras)}")
        return parsed, extras

    def _suggest(self, extras: list[str]) -> str:
        """`` (did you mean '--title'?)`` for the first mistyped flag close to a real one."""
        flags = [flag for flag in self._option_string_actions if flag.startswith("--")]
        for extra in extras:
            word = extra.split("=", 1)[0]
            if word.startswith("-"):
                close = difflib.get_close_matches(word, flags, n=1, cutoff=0.6)
                if close:
                    return f" (did you mean {close[0]!r}?)"
        return ""

    def _commands(self) -> list[str]:
        for action in self._actions:
            if isinstance(action.choices, dict):
                return list(action.choices)
        return []

    def error(self, message: str) -> NoReturn:
        if _MISSING_COMMAND.match(message):
            self.print_help(sys.stderr)
            self.exit(2, f"\n{self.prog}: error: {message}\n")
        if message.startswith("the following arguments are required"):
            for word in getattr(self, "_given", []):
                flag = word.split("=", 1)[0]
                if flag.startswith("--") and flag not in self._option_string_actions:
                    hint = self._suggest([flag])
                    if hint:
                        message += f"; {flag!r} is not a flag{hint}"
                        break
        invalid = _INVALID_CHOICE.match(message)
        if invalid:
            word = invalid.group(1)
            close = difflib.get_close_matches(word, self._commands(), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            message = f"unknown command {word!r}{hint}; see '{self.prog} --help'"
        super().error(message)


def command_words(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[str, ...] | None:
    """The command ``argv`` names and the word after it (an operation group's verb), as
    ``parser`` (the top level, its options added) will read them: ``()`` when no command is
    reached (``--help`` comes first, or none is given). ``None`` when this scan cannot be sure
    (an unknown flag, ``--``, a value that looks like a flag): then every parser is built."""
    words: list[str] = []
    takes_value = False
    for word in argv:
        if words:
            if word.startswith("-"):
                # The group's --help shows only its verbs' help lines; any other flag: unsure.
                return tuple(words) if word in ("-h", "--help") else None
            return (*words, word)
        if takes_value:
            if word.startswith("-"):
                return None
            takes_value = False
        elif word.startswith("-"):
            flag, explicit, _ = word.partition("=")
            action = parser._option_string_actions.get(flag)  # noqa: SLF001
            if action is None or (explicit and action.nargs == 0):
                return None
            if isinstance(action, argparse._HelpAction):  # noqa: SLF001
                return ()
            takes_value = action.nargs != 0 and not explicit
        else:
            words.append(word)
    return tuple(words)


def _command_modules(words: tuple[str, ...] | None) -> tuple[ModuleType, ...]:
    """The modules whose commands the parser needs: a module of its own alone when the line
    names one of its commands, else all (``calls`` imports the client and the catalog)."""
    for module in (serve, tokens, editor, terminal):
        if words and words[0] in module.NAMES:
            return (module,)
    from cleveragents.acp.client.cli import calls

    return (serve, tokens, editor, terminal, calls)


def build_parser(argv: Sequence[str] | None = None) -> Parser:
    """The parser for ``argv`` (only the parsers it can reach built in full), or with no
    ``argv`` the whole one, every command and verb in full."""
    parser = Parser(
        prog="agents",
        usage="%(prog)s [options] COMMAND ...",
        description="CleverAgents ACP: every ACP operation as `agents GROUP VERB`, in-process or "
        "against a server; and the server itself.",
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(parser, top_level=True)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, prog="agents")
    words = None if argv is None else command_words(parser, argv)
    for module in _command_modules(words):
        module.register(subparsers, words)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    misplaced = given_globally(args)
    if misplaced and not getattr(args, "connects", False):
        parser.error(f"{', '.join(misplaced)}: only for commands that call operations")
    logging.basicConfig(
        # serve and gateway set theirs once their settings are read (flags, environment, file).
        level=(getattr(args, "log_level", None) or "warning").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    handler: Any = args.handler
    status: int = handler(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
