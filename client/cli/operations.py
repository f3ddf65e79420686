"""One command per catalog operation: ``agents <group> <verb>``.

Groups, verbs, arguments, help and examples come from the catalog and the request
descriptors, so an RPC added to the proto is a command with no code here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

from google.protobuf import message
from google.protobuf.descriptor import Descriptor

from cleveragents.acp.client.cli import fields, value_path
from cleveragents.acp.client.cli.connect import add_options, option
from cleveragents.acp.contract import catalog, codec
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError

# Runs one operation's request (already checked) and returns the exit status.
Runner = Callable[[Operation, message.Message, argparse.Namespace], int]
_OPTION_FLAGS = frozenset(
    {"--server", "--token", "--grpc", "--db", "--ca-cert", "--acp-version", "--profile"}
    | {"--json", "--envelope", "--value"}
)


# A shorter verb users type for an operation, besides its own (``agents session cancel``
# for ``session.cancel_turn``, as docs/sessions.md spells it). Not listed twice in the help.
VERB_ALIASES: dict[str, str] = {"session.cancel_turn": "cancel"}


def cli_name(group: str) -> str:
    return group.replace("_", "-")


def request_descriptor(op: Operation) -> Descriptor:
    return cast(Descriptor, op.request_type.DESCRIPTOR)


def response_descriptor(op: Operation) -> Descriptor:
    return cast(Descriptor, op.response_type.DESCRIPTOR)


def example(op: Operation) -> str:
    """The shortest complete call: positionals and required flags as placeholders."""
    return " ".join(["agents", cli_name(op.group), op.verb, *_required_words(op)])


def _required_words(op: Operation) -> list[str]:
    words: list[str] = []
    for arg in fields.arguments(request_descriptor(op)):
        if arg.positional:
            words.append(arg.field.name.upper())
        elif arg.required:
            words += [arg.flag, fields.metavar(arg.field)]
    return words


def _description(op: Operation) -> str:
    route = f"{op.http.method} {op.http.path}"
    stream = " It streams its results until interrupted." if op.server_streaming else ""
    return f"{op.summary}{stream}\n\nACP operation {op.name} (since {op.since}); REST: {route}."


def _epilog(op: Operation) -> str:
    """The shape of each document the verb takes (its usage line already is the shortest
    call, so no "example" repeats it)."""
    lines: list[str] = []
    for field in fields.documents(request_descriptor(op)):
        assert field.message_type is not None
        many = "a list of " if field.is_repeated else ""
        lines += ["", f"{fields.flag_of(field)} takes {many}{field.message_type.name} (JSON or YAML):"]
        lines += fields.skeleton(field.message_type)
    return "\n".join(lines[1:])


def _group_epilog(ops: list[Operation]) -> str:
    lines = ["examples:"]
    lines += [f"  {example(op)}" for op in sorted(ops, key=lambda o: o.verb)]
    lines.append("\nEach VERB's --help shows its options and the shape of its documents.")
    return "\n".join(lines)


def groups(operations: Iterable[Operation]) -> dict[str, list[Operation]]:
    by_group: dict[str, list[Operation]] = {}
    for op in operations:
        by_group.setdefault(op.group, []).append(op)
    return by_group


def _handler(op: Operation, spec: list[fields.Argument], parser: argparse.ArgumentParser, run: Runner) -> Any:
    def handle(args: argparse.Namespace) -> int:
        """Bad input is found here, before any connection: usage and exit 2."""
        wanted = option(args, "value")
        if wanted:
            mistake = value_path.problem(response_descriptor(op), wanted)
            if mistake:
                parser.error(mistake)
        try:
            request = codec.from_dict(fields.params(args, spec), op.request_type)
        except fields.InputError as exc:
            parser.error(str(exc))
        except ACPError as exc:
            parser.error(exc.message.removeprefix("invalid params: "))
        return run(op, request, args)

    return handle


def register(
    subparsers: Any,
    run: Runner,
    *,
    words: Sequence[str] | None = None,
    operations: Iterable[Operation] | None = None,
    extra_verbs: dict[str, list[str]] | None = None,
    formatter: type[argparse.HelpFormatter] = argparse.RawDescriptionHelpFormatter,
) -> dict[str, argparse.ArgumentParser]:
    """Add a parser per group and a sub-parser per verb; returns the group parsers built in
    full so callers can add verbs of their own (``events watch``, ``session chat``), named
    in ``extra_verbs`` for the overview. With ``words`` (the command line's command and verb,
    see ``main.command_words``) only the group and verb it names are built in full: of the
    others only what the overview and the choices show, a name and a help line."""
    group_parsers: dict[str, argparse.ArgumentParser] = {}
    extra = extra_verbs or {}
    command = words[0] if words else None
    verb = words[1] if words is not None and len(words) > 1 else None
    for group, ops in sorted(groups(operations or catalog.CATALOG.commands()).items()):
        overview = f"{group}: {', '.join(sorted([op.verb for op in ops] + extra.get(group, [])))}"
        if words is not None and command not in (cli_name(group), group):
            group_parser = subparsers.add_parser(cli_name(group), help=overview)
            _alias(subparsers, group, group_parser)
            continue
        group_parser = subparsers.add_parser(
            cli_name(group),
            help=overview,
            description=f"The {group}.* operations of ACP.",
            epilog=_group_epilog(ops),
            formatter_class=formatter,
        )
        _alias(subparsers, group, group_parser)
        verbs = group_parser.add_subparsers(dest="verb", metavar="VERB", required=True)
        for op in sorted(ops, key=lambda o: o.verb):
            if words is not None and verb not in (op.verb, VERB_ALIASES.get(op.name)):
                verbs.add_parser(op.verb, help=op.summary)
                continue
            parser = verbs.add_parser(
                op.verb,
                usage=" ".join(["%(prog)s", *_required_words(op), "[options]"]),
                help=op.summary,
                description=_description(op),
                epilog=_epilog(op),
                formatter_class=formatter,
            )
            spec = fields.add_arguments(parser, request_descriptor(op))
            taken = frozenset(arg.flag for arg in spec) & _OPTION_FLAGS
            add_options(parser, taken=taken)
            if op.if_revision:
                parser.add_argument(
                    "--if-revision",
                    type=int,
                    metavar="REVISION",
                    help=f"the {op.if_revision}'s revision you read: refused with no effect "
                    "(INVALID_STATE REVISION_MISMATCH) when it moved since",
                )
            parser.set_defaults(handler=_handler(op, spec, parser, run), connects=True)
            alias = VERB_ALIASES.get(op.name)
            if alias is not None:
                verbs._name_parser_map[alias] = parser  # noqa: SLF001
        group_parsers[group] = group_parser
        group_parser.set_defaults(verbs=verbs)
    return group_parsers


def _alias(subparsers: Any, group: str, group_parser: argparse.ArgumentParser) -> None:
    """The operation's own spelling works too, without a second entry in the help:
    argparse's private name table (add_parser's aliases would list it in the help)."""
    if cli_name(group) != group:
        subparsers._name_parser_map[group] = group_parser  # noqa: SLF001
