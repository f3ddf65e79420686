"""The handler table: operation name -> ``async (request, CallContext) -> response``
(a stream's handler returns an ``AsyncIterator`` of responses instead).

Handlers are methods of handler groups (``SessionHandlers``...), each marked with
``@handles("session.create")``: the catalog stays the only list of operations, and the
mark names the operation and, by the method's name or ``rpc=``, its RPC, so a grep for
``session.create`` or ``CreateSession`` lands on the method that serves it. The table is
checked against the catalog when it is built: every operation it serves has exactly one
handler, of the right kind (coroutine or stream), and nothing else has one.

The table holds every major of the catalog: an operation of major 1 is keyed by its name
(``session.show``), one of a later major by ``Operation.key`` (``session.show@v2``), and
its handler is marked ``@handles("session.show", major=2)``.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from google.protobuf import message

from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.catalog import Operation

Unary = Callable[[Any, CallContext], Awaitable[message.Message]]
Streaming = Callable[[Any, CallContext], AsyncIterator[message.Message]]
Handler = Unary | Streaming
F = TypeVar("F", bound=Callable[..., Any])

_MARK = "__acp_operations__"


class HandlerTableError(Exception):
    """The handlers do not match the catalog: a start-up error naming the operation."""


def handles(operation: str, *, rpc: str | None = None, major: int = 1) -> Callable[[F], F]:
    """Mark a method as the handler of ``operation`` of the major version ``major``;
    ``rpc`` is its RPC method name, by default the method's own name. Marks stack: one
    method may serve several operations (the registry verbs serve every kind), each named
    by its own mark."""
    key = operation if major == 1 else f"{operation}@v{major}"

    def mark(method: F) -> F:
        marks: list[tuple[str, str]] = method.__dict__.setdefault(_MARK, [])
        marks.append((key, rpc or method.__name__))
        return method

    return mark


def _marked(group: object) -> Iterator[tuple[str, str, Handler]]:
    """(operation key, rpc, bound handler) for every mark on the group's methods."""
    for name, attribute in inspect.getmembers(type(group), inspect.isfunction):
        for key, rpc in getattr(attribute, _MARK, ()):
            yield key, rpc, getattr(group, name)


def _check(op: Operation, rpc: str, handler: Handler) -> None:
    if rpc != op.method:
        raise HandlerTableError(f"{op.name} is the RPC {op.method}, but its handler names it {rpc}")
    if inspect.iscoroutinefunction(handler) == op.server_streaming:
        shape = "return an async iterator" if op.server_streaming else "be a coroutine function"
        raise HandlerTableError(f"the handler of {op.name} must {shape}")


def build(
    groups: Iterable[object],
    *,
    serves: Iterable[str] | None = None,
    contract: catalog.Catalog | None = None,
) -> Mapping[str, Handler]:
    """The table of the handlers marked on ``groups``, checked against the catalog
    (``contract``, default: the product's, every major).

    ``serves`` names the operations the table must serve, by ``Operation.key`` (default:
    every operation of the catalog); a missing handler, a second one, or one for any other
    operation is a ``HandlerTableError`` naming the operation."""
    known = {op.key: op for op in (contract or catalog.CATALOG).operations()}
    wanted = set(known) if serves is None else set(serves)
    unknown = sorted(wanted - set(known))
    if unknown:
        raise HandlerTableError(f"no operation {', '.join(unknown)} in the catalog")
    table: dict[str, Handler] = {}
    for group in groups:
        for name, rpc, handler in _marked(group):
            op = known.get(name)
            if op is None:
                raise HandlerTableError(f"{handler.__qualname__} handles {name}, which the catalog lacks")
            if name not in wanted:
                raise HandlerTableError(
                    f"{handler.__qualname__} handles {name}, which this table does not serve"
                )
            if name in table:
                raise HandlerTableError(
                    f"{name} has two handlers: {table[name].__qualname__} and {handler.__qualname__}"
                )
            _check(op, rpc, handler)
            table[name] = handler
    missing = sorted(wanted - set(table))
    if missing:
        raise HandlerTableError(f"no handler for {', '.join(missing)}")
    return dict(sorted(table.items()))
