"""The handler table: built from the catalog, every operation served exactly once, each
handler findable by a grep for its operation or RPC name, and every mismatch with the
catalog a start-up error naming the operation."""

from __future__ import annotations

import inspect
import pathlib
import re

import pytest

from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.facade.handlers import table
from cleveragents.acp.facade.handlers.meta import MetaHandlers
from cleveragents.acp.facade.handlers.table import HandlerTableError, handles
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.v1 import events_pb2, meta_pb2

HANDLERS = pathlib.Path(table.__file__).parent


def test_the_facade_serves_every_operation_of_the_catalog(facade: ServiceFacade) -> None:
    assert facade.served_operations == set(catalog.OPERATIONS)


def test_a_grep_for_an_operation_or_its_rpc_lands_on_its_handler(facade: ServiceFacade) -> None:
    for name, handler in facade._handlers.items():
        op = catalog.OPERATIONS[name]
        source = inspect.getsource(handler)
        assert f'@handles("{name}"' in source, name
        assert re.search(rf"\b{op.method}\b", source), f"{name}: {op.method} not in its handler's source"


def test_handlers_neither_authorize_nor_resolve_namespaces() -> None:
    """Authorization happens in the domain, on the call context (one rule for every group)."""
    for path in sorted(HANDLERS.glob("*.py")):
        text = path.read_text()
        for call in ("ctx.authorize(", "ctx.namespace(", "ctx.visible_namespaces(", "ctx.principal"):
            assert call not in text, f"{path.name} calls {call}"


def test_a_missing_handler_is_named() -> None:
    with pytest.raises(HandlerTableError, match=r"no handler for .*\bactor\.add\b"):
        table.build([MetaHandlers()])


def test_a_partial_table_serves_what_it_names() -> None:
    built = table.build([MetaHandlers()], serves=["meta.version"])
    assert list(built) == ["meta.version"]
    with pytest.raises(HandlerTableError, match=r"no handler for events\.subscribe"):
        table.build([MetaHandlers()], serves=["meta.version", "events.subscribe"])
    with pytest.raises(HandlerTableError, match=r"no operation plan\.launch in the catalog"):
        table.build([MetaHandlers()], serves=["meta.version", "plan.launch"])


def test_a_handler_for_an_operation_not_served_is_named() -> None:
    with pytest.raises(HandlerTableError, match=r"GetVersion handles meta\.version, which this table"):
        table.build([MetaHandlers()], serves=[])


def test_a_handler_for_an_unknown_operation_is_named() -> None:
    class Stray:
        @handles("meta.uptime", rpc="GetUptime")
        async def uptime(self, request: meta_pb2.GetVersionRequest, ctx: CallContext) -> None: ...

    with pytest.raises(
        HandlerTableError, match=r"Stray\.uptime handles meta\.uptime, which the catalog lacks"
    ):
        table.build([MetaHandlers(), Stray()], serves=["meta.version"])


def test_two_handlers_for_one_operation_are_named() -> None:
    with pytest.raises(HandlerTableError, match=r"meta\.version has two handlers"):
        table.build([MetaHandlers(), MetaHandlers()], serves=["meta.version"])


def test_the_rpc_a_handler_names_must_be_its_operations() -> None:
    class Misnamed:
        @handles("meta.version")
        async def Version(self, request: meta_pb2.GetVersionRequest, ctx: CallContext) -> None: ...

    with pytest.raises(
        HandlerTableError, match=r"meta\.version is the RPC GetVersion, but its handler names it Version"
    ):
        table.build([Misnamed()], serves=["meta.version"])


def test_a_unary_handler_is_a_coroutine_and_a_stream_handler_is_not() -> None:
    class SyncUnary:
        @handles("meta.version")
        def GetVersion(self, request: meta_pb2.GetVersionRequest, ctx: CallContext) -> None: ...

    class CoroutineStream:
        @handles("events.subscribe")
        async def SubscribeEvents(
            self, request: events_pb2.SubscribeEventsRequest, ctx: CallContext
        ) -> None: ...

    with pytest.raises(HandlerTableError, match=r"meta\.version must be a coroutine function"):
        table.build([SyncUnary()], serves=["meta.version"])
    with pytest.raises(HandlerTableError, match=r"events\.subscribe must return an async iterator"):
        table.build([CoroutineStream()], serves=["events.subscribe"])
