"""The in-process client: by name, by helper, by stub; version gating and errors."""

from __future__ import annotations

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.client.stubs import local_stub
from cleveragents.acp.facade.contract.errors import ACPError
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.v1 import meta_pb2


async def test_call_by_name_and_helper(client: ACPClient) -> None:
    by_name = await client.call("meta.version")
    assert isinstance(by_name, meta_pb2.GetVersionResponse)
    assert list(by_name.supported_versions) == ["1.1", "1.0"]
    assert await client.ops.meta.version() == by_name


async def test_in_process_stub_has_the_grpc_surface(facade: ServiceFacade) -> None:
    stub = local_stub(facade, "MetaService")
    response = await stub.GetVersion(meta_pb2.GetVersionRequest())
    assert response.current_version == "1.1"
    with pytest.raises(AttributeError):
        _ = stub.NoSuchMethod


async def test_a_10_client_cannot_call_a_11_operation(facade: ServiceFacade) -> None:
    old = ACPClient(LocalTransport(facade), acp_version="1.0")
    with pytest.raises(ACPError) as info:
        await old.call("meta.version")
    assert info.value.code == "VERSION_MISMATCH"
    assert info.value.details["since"] == "1.1"


async def test_unsupported_version(facade: ServiceFacade) -> None:
    client = ACPClient(LocalTransport(facade), acp_version="0.9")
    with pytest.raises(ACPError) as info:
        await client.call("meta.version")
    assert info.value.code == "VERSION_MISMATCH"
    assert info.value.details["supported_versions"] == ["1.1", "1.0"]


async def test_unknown_operation_and_bad_params(client: ACPClient) -> None:
    with pytest.raises(ACPError) as info:
        await client.call("plan.fly")
    assert info.value.code == "NOT_FOUND"
    with pytest.raises(ACPError) as info:
        await client.call("meta.version", {"bogus": 1})
    assert info.value.code == "INVALID_PARAMS"
    with pytest.raises(AttributeError):
        _ = client.ops.nogroup
