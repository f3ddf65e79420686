"""One command per catalog operation: ``agents <group> <verb>``.

Groups, verbs, arguments and help come from the catalog and the request descriptors, so
an RPC added to the proto is a command with no code here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable
from typing import Any, cast

from google.protobuf.descriptor import Descriptor

from cleveragents.acp.client.cli import fields
from cleveragents.acp.client.cli.connect import add_options
from cleveragents.acp.facade.contract import catalog
from cleveragents.acp.facade.contract.catalog import Operation

Runner = Callable[[Operation, list[fields.Argument], argparse.Namespace], int]


def cli_name(group: str) -> str:
    return group.replace("_", "-")


def _description(op: Operation) -> str:
    route = f"{op.http.method} {op.http.path}"
    return f"{op.summary}\n\nACP operation {op.name} (since {op.since}); REST: {route}."


def groups(operations: Iterable[Operation]) -> dict[str, list[Operation]]:
    by_group: dict[str, list[Operation]] = {}
    for op in operations:
        by_group.setdefault(op.group, []).append(op)
    return by_group


def register(
    subparsers: Any,
    run: Runner,
    *,
    operations: Iterable[Operation] | None = None,
    formatter: type[argparse.HelpFormatter] = argparse.RawDescriptionHelpFormatter,
) -> dict[str, argparse.ArgumentParser]:
    """Add a parser per group and a sub-parser per verb; returns the group parsers so
    callers can add verbs of their own (``events watch``, ``session chat``)."""
    group_parsers: dict[str, argparse.ArgumentParser] = {}
    for group, ops in sorted(groups(operations or catalog.OPERATIONS.values()).items()):
        aliases = [group] if cli_name(group) != group else []
        group_parser = subparsers.add_parser(
            cli_name(group),
            aliases=aliases,
            help=f"{group} operations: {', '.join(op.verb for op in ops)}",
            formatter_class=formatter,
        )
        verbs = group_parser.add_subparsers(dest="verb", metavar="VERB", required=True)
        for op in sorted(ops, key=lambda o: o.verb):
            parser = verbs.add_parser(
                op.verb, help=op.summary, description=_description(op), formatter_class=formatter
            )
            spec = fields.add_arguments(parser, cast(Descriptor, op.request_type.DESCRIPTOR))
            add_options(parser, suppress=True)
            parser.set_defaults(handler=lambda args, op=op, spec=spec: run(op, spec, args))
        group_parsers[group] = group_parser
        group_parser.set_defaults(verbs=verbs)
    return group_parsers
