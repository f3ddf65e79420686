"""The in-process client: by name, by helper, by stub; version gating and errors."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from google.protobuf import message

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.client.stubs import local_stub
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.contract.transport import CallOptions
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.v1 import meta_pb2


async def test_call_by_name_and_helper(client: ACPClient) -> None:
    by_name = await client.call("meta.version")
    assert isinstance(by_name, meta_pb2.GetVersionResponse)
    assert list(by_name.supported_versions) == ["1.3", "1.2", "1.1"]
    assert await client.ops.meta.version() == by_name


async def test_in_process_stub_has_the_grpc_surface(facade: ServiceFacade) -> None:
    stub = local_stub(facade, "MetaService")
    response = await stub.GetVersion(meta_pb2.GetVersionRequest())
    assert response.current_version == "1.3"
    with pytest.raises(AttributeError):
        _ = stub.NoSuchMethod


async def test_a_client_of_the_prior_minor_is_served_what_it_knows(facade: ServiceFacade) -> None:
    prior = ACPClient(LocalTransport(facade), acp_version="1.1")
    assert list((await prior.call("meta.version")).supported_versions) == ["1.3", "1.2", "1.1"]  # type: ignore[attr-defined]
    retired = ACPClient(LocalTransport(facade), acp_version="1.0")
    with pytest.raises(ACPError) as info:
        await retired.call("meta.version")
    assert info.value.code == "VERSION_MISMATCH"
    assert info.value.details["requested"] == "1.0"


async def test_unsupported_version(facade: ServiceFacade) -> None:
    client = ACPClient(LocalTransport(facade), acp_version="0.9")
    with pytest.raises(ACPError) as info:
        await client.call("meta.version")
    assert info.value.code == "VERSION_MISMATCH"
    assert info.value.details["supported_versions"] == ["1.3", "1.2", "1.1"]


async def test_unknown_operation_and_bad_params(client: ACPClient) -> None:
    with pytest.raises(ACPError) as info:
        await client.call("plan.fly")
    assert info.value.code == "NOT_FOUND"
    with pytest.raises(ACPError) as info:
        await client.call("meta.version", {"bogus": 1})
    assert info.value.code == "INVALID_PARAMS"
    with pytest.raises(AttributeError):
        _ = client.ops.nogroup


class _Items:
    """A transport's stream items that tell whether they were closed."""

    def __init__(self, items: AsyncIterator[message.Message]) -> None:
        self.items = items
        self.closed = False

    def __aiter__(self) -> _Items:
        return self

    async def __anext__(self) -> message.Message:
        return await anext(self.items)

    async def aclose(self) -> None:
        self.closed = True
        await self.items.aclose()  # type: ignore[attr-defined]


class _Watching(LocalTransport):
    opened: list[_Items]

    async def open_stream(self, op: Operation, request: message.Message, options: CallOptions) -> _Items:
        items = _Items(await super().open_stream(op, request, options))
        self.opened.append(items)
        return items


async def test_a_subscriber_that_stops_early_closes_its_stream(facade: ServiceFacade) -> None:
    """Found by the contract suite: the stream stayed open until garbage collection."""
    transport = _Watching(facade)
    transport.opened = []
    client = ACPClient(transport)
    created = await client.call("session.create")
    await client.call("session.tell", session_id=created.session.meta.id, content="hi")  # type: ignore[attr-defined]
    events = client.subscribe()
    assert (await anext(events)).type == "session.turn_started"  # a tell's first event (ACP 1.3)
    await events.aclose()  # type: ignore[attr-defined]
    assert [items.closed for items in transport.opened] == [True]
