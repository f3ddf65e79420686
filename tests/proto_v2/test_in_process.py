"""ACP 2 beside ACP 1 in one process: the catalog and the handler table hold both, and the
local transport calls the operation of the major the client's version names."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cleveragents.acp.client.acp_client import ACPClient, in_major
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.catalog import Catalog
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade import factory
from cleveragents.acp.facade.handlers import table
from cleveragents.acp.facade.handlers.meta import MetaHandlers
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.v1 import session_pb2
from tests.proto_v2 import contract, handlers


@pytest.fixture
async def facade(
    v1_and_v2: Catalog, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[ServiceFacade]:
    monkeypatch.setattr(table, "build", handlers.serve_v2(table.build, v1_and_v2))
    facade = factory.open_facade(tmp_path / "acp.db")
    yield facade
    await facade.close()


def _client(facade: ServiceFacade, version: str | None, contract_: Catalog) -> ACPClient:
    return ACPClient(LocalTransport(facade), acp_version=version, contract=contract_)


async def _error(client: ACPClient, operation: str, **fields: Any) -> ACPError:
    with pytest.raises(ACPError) as caught:
        await client.call(operation, **fields)
    return caught.value


def test_the_catalog_holds_both_majors_each_with_its_prefix_package_and_versions(v1_and_v2: Catalog) -> None:
    v1, v2 = v1_and_v2.majors[1], v1_and_v2.majors[2]
    assert (v1.prefix, v1.package, v1.version_table.supported) == (
        "/api/v1",
        "cleveragents.acp.v1",
        ("1.3", "1.2", "1.1"),
    )
    assert (v2.prefix, v2.package, v2.version_table.supported) == ("/api/v2", "cleveragents.acp.v2", ("2.0",))
    assert list(v2.operations) == ["events.subscribe", "session.count", "session.show"]
    assert (
        v2.operations["events.subscribe"].full_method == "/cleveragents.acp.v2.EventService/SubscribeEvents"
    )
    show = v2.operations["session.show"]
    assert show.key == "session.show@v2"
    assert show.full_method == "/cleveragents.acp.v2.SessionService/GetSession"
    assert show.http.path == "/api/v2/sessions/{session_id}"
    assert v1_and_v2.by_full_method[show.full_method] is show
    assert v1_and_v2.get("session.show", "2.0") is show
    assert v1_and_v2.get("session.show", "1.1") is v1.operations["session.show"]
    assert v1_and_v2.get("session.create", "2.0") is None


def test_commands_offer_each_name_once_preferring_the_default_major(v1_and_v2: Catalog) -> None:
    commands = {op.name: op for op in v1_and_v2.commands()}
    assert len(commands) == len(v1_and_v2.commands())
    assert commands["session.show"] is v1_and_v2.majors[1].operations["session.show"]
    assert commands["session.count"] is v1_and_v2.majors[2].operations["session.count"]
    assert set(commands) == set(v1_and_v2.majors[1].operations) | {"session.count"}


def test_the_handler_table_needs_a_handler_for_each_major(v1_and_v2: Catalog) -> None:
    with pytest.raises(table.HandlerTableError, match=r"no handler for session\.show@v2"):
        table.build([MetaHandlers()], serves=["meta.version", "session.show@v2"], contract=v1_and_v2)
    with pytest.raises(table.HandlerTableError, match=r"session\.(show|count)@v2, which the catalog lacks"):
        table.build([handlers.SessionHandlersV2(None)], serves=[])  # type: ignore[arg-type]


async def test_each_version_gets_its_majors_shape(facade: ServiceFacade, v1_and_v2: Catalog) -> None:
    v1 = _client(facade, None, v1_and_v2)
    session = (await v1.call("session.create", title="two majors")).session  # type: ignore[attr-defined]
    await v1.call("session.tell", session_id=session.meta.id, content="/help")

    shown_v1 = await v1.call("session.show", session_id=session.meta.id)
    assert isinstance(shown_v1, session_pb2.GetSessionResponse)
    assert len(shown_v1.messages) == 2

    v2 = _client(facade, "2.0", v1_and_v2)
    shown_v2 = await v2.call("session.show", session_id=session.meta.id)
    assert type(shown_v2) is contract.session_pb2().GetSessionResponse
    assert shown_v2.session == shown_v1.session  # type: ignore[attr-defined]
    assert shown_v2.message_count == 2  # type: ignore[attr-defined]
    assert shown_v2.latest_message == shown_v1.messages[-1]  # type: ignore[attr-defined]
    # Same operation name, the ACP 1 client still sees ACP 1.
    assert isinstance(
        await v1.call("session.show", session_id=session.meta.id), session_pb2.GetSessionResponse
    )


async def test_a_stream_of_the_second_major(facade: ServiceFacade, v1_and_v2: Catalog) -> None:
    v1 = _client(facade, None, v1_and_v2)
    session = (await v1.call("session.create", title="stream")).session  # type: ignore[attr-defined]
    await v1.call("session.tell", session_id=session.meta.id, content="/help")
    v2 = _client(facade, "2.0", v1_and_v2)
    events = v2.subscribe(session_id=session.meta.id)
    try:
        first = await anext(events)
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    assert first.session_id == session.meta.id


async def test_bad_calls_of_the_second_major_get_acp_errors(
    facade: ServiceFacade, v1_and_v2: Catalog
) -> None:
    v2 = _client(facade, "2.0", v1_and_v2)
    err = await _error(v2, "session.create", title="x")
    assert (err.code, err.details) == ("NOT_FOUND", {"operation": "session.create"})
    assert "ACP 2" in err.message
    err = await _error(v2, "session.show")
    assert (err.code, err.details["missing_fields"]) == ("INVALID_PARAMS", ["session_id"])
    err = await _error(v2, "session.show", session_id="nope")
    assert err.code == "NOT_FOUND"
    err = await _error(v2, "session.show", session_id="x", latest="y")
    assert err.code == "INVALID_PARAMS"
    # 2.1 names major 2, which speaks only 2.0; 3.0 names no major: the default one refuses it.
    err = await _error(_client(facade, "2.1", v1_and_v2), "session.show", session_id="x")
    assert (err.code, err.details["supported_versions"]) == ("VERSION_MISMATCH", ["2.0"])
    err = await _error(_client(facade, "3.0", v1_and_v2), "session.show", session_id="x")
    assert (err.code, err.details["supported_versions"]) == ("VERSION_MISMATCH", ["1.3", "1.2", "1.1"])


async def test_an_operation_carried_to_another_major_keeps_its_request(v1_and_v2: Catalog) -> None:
    v1_show = v1_and_v2.majors[1].operations["session.show"]
    op, request = in_major(v1_show, session_pb2.GetSessionRequest(session_id="s1"), v1_and_v2.majors[2])
    assert op is v1_and_v2.majors[2].operations["session.show"]
    assert type(request) is contract.session_pb2().GetSessionRequest
    assert request.session_id == "s1"  # type: ignore[attr-defined]
    with pytest.raises(ACPError, match="in ACP 2"):
        in_major(
            v1_and_v2.majors[1].operations["plan.list"], session_pb2.GetSessionRequest(), v1_and_v2.majors[2]
        )


async def test_an_operation_only_the_second_major_has(facade: ServiceFacade, v1_and_v2: Catalog) -> None:
    v1 = _client(facade, None, v1_and_v2)
    session = (await v1.call("session.create", title="count")).session  # type: ignore[attr-defined]
    await v1.call("session.tell", session_id=session.meta.id, content="/help")
    v2 = _client(facade, "2.0", v1_and_v2)
    counted = await v2.call("session.count", session_id=session.meta.id)
    assert counted.message_count == 2  # type: ignore[attr-defined]
    assert (await _error(v1, "session.count", session_id=session.meta.id)).code == "NOT_FOUND"
