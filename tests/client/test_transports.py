"""The three transports give the same results and the same ``ACPError``s.

LocalTransport runs over an in-process facade with the same token file as a real server
(subprocess) that HTTPTransport and GrpcTransport reach over the network.
"""

from __future__ import annotations

import pathlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract import catalog, codec
from cleveragents.acp.contract.errors import ACPError, TransportError
from cleveragents.acp.contract.retry import RetryPolicy
from cleveragents.acp.contract.transport import CallOptions, Transport
from cleveragents.acp.facade.auth import TokenAuthenticator
from cleveragents.acp.facade.factory import open_facade
from tests.server_process import ServerProcess, Tokens, start_server

KINDS = ["local", "http", "grpc"]


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Tokens]]:
    directory = tmp_path_factory.mktemp("transports")
    tokens = Tokens.create(directory)
    server = start_server(directory, tokens=tokens.path)
    yield server, tokens
    assert server.stop() == 0, server.stderr()


Factory = Callable[..., ACPClient]


@pytest.fixture
async def clients(
    remote: tuple[ServerProcess, Tokens], tmp_path: pathlib.Path
) -> AsyncIterator[dict[str, Factory]]:
    server, tokens = remote
    facade = open_facade(tmp_path / "local.db", authenticator=TokenAuthenticator(tokens.path))
    made: list[ACPClient] = []

    def transport(kind: str) -> Transport:
        if kind == "local":
            return LocalTransport(facade)
        if kind == "http":
            return HTTPTransport(httpx.AsyncClient(base_url=server.http, timeout=10), owns_client=True)
        return GrpcTransport.connect(server.grpc_target, timeout=10)

    def factory(kind: str, principal: str | None = None, **kwargs: Any) -> ACPClient:
        token = tokens.tokens.get(principal or "", principal)
        client = ACPClient(transport(kind), token=token, **kwargs)
        made.append(client)
        return client

    yield {kind: (lambda *a, kind=kind, **k: factory(kind, *a, **k)) for kind in KINDS}
    for client in made:
        await client.close()
    await facade.close()


async def outcome(action: Awaitable[Any]) -> Any:
    """The canonical JSON of a result, or the error's (code, message, details)."""
    try:
        result = await action
    except ACPError as err:
        return ("error", err.code, err.message, err.details)
    return codec.to_dict(result)


async def same_everywhere(
    clients: dict[str, Factory], run: Callable[[ACPClient], Awaitable[Any]], *args: Any, **kwargs: Any
) -> Any:
    results = {kind: await outcome(run(make(*args, **kwargs))) for kind, make in clients.items()}
    assert results["http"] == results["local"], results
    assert results["grpc"] == results["local"], results
    return results["local"]


async def test_version(clients: dict[str, Factory]) -> None:
    version = await same_everywhere(clients, lambda c: c.call("meta.version"))
    assert version["supported_versions"] == ["1.3", "1.2", "1.1"]


@pytest.mark.parametrize(
    ("principal", "version", "operation", "params", "code"),
    [
        (None, None, "session.list", {}, "AUTH_REQUIRED"),
        ("acp_bogus", None, "session.list", {}, "AUTH_REQUIRED"),
        (None, "1.0", "meta.version", {}, "VERSION_MISMATCH"),
        (None, "0.9", "meta.version", {}, "VERSION_MISMATCH"),
        ("alice", "1.0", "plan.list", {}, "VERSION_MISMATCH"),
        ("alice", None, "session.show", {}, "INVALID_PARAMS"),
        ("alice", None, "session.show", {"session_id": "01J00000000000000000000000"}, "NOT_FOUND"),
        ("bob", None, "session.create", {"namespace": "default"}, "AUTH_FORBIDDEN"),
        ("bob", None, "session.list", {"namespace": "default"}, "AUTH_FORBIDDEN"),
        ("alice", None, "session.list", {"page_size": -1}, "INVALID_PARAMS"),
        ("alice", None, "session.list", {"page_token": "forged"}, "INVALID_PARAMS"),
    ],
)
async def test_errors(
    clients: dict[str, Factory],
    principal: str | None,
    version: str | None,
    operation: str,
    params: dict[str, Any],
    code: str,
) -> None:
    result = await same_everywhere(
        clients, lambda c: c.call(operation, params), principal, acp_version=version
    )
    assert result[:2] == ("error", code), result


async def test_a_stream_is_not_a_call_and_a_call_is_not_a_stream(clients: dict[str, Factory]) -> None:
    subscribe, version = catalog.OPERATIONS["events.subscribe"], catalog.OPERATIONS["meta.version"]
    options = CallOptions(acp_version=None, token=None, request_id="r1")

    async def call_a_stream(client: ACPClient) -> Any:
        return await client.transport.call(subscribe, subscribe.request_type(), options)

    async def stream_a_call(client: ACPClient) -> Any:
        return await client.transport.open_stream(version, version.request_type(), options)

    assert (await same_everywhere(clients, call_a_stream))[1] == "INVALID_PARAMS"
    assert (await same_everywhere(clients, stream_a_call))[1] == "INVALID_PARAMS"


async def first_events(client: ACPClient, count: int, **filters: Any) -> list[Any]:
    events = []
    async for event in client.subscribe(filters):
        events.append(event)
        if len(events) == count:
            break
    return events


async def test_subscribe(clients: dict[str, Factory]) -> None:
    seen = {}
    for kind, make in clients.items():
        client = make("alice")
        created = await client.call("session.create", {"title": kind})
        session_id = created.session.meta.id  # type: ignore[attr-defined]
        await client.call("session.tell", {"session_id": session_id, "content": "hello"})
        events = await first_events(client, 2, session_id=session_id)
        assert [e.session_id for e in events] == [session_id, session_id]
        assert events[0].sequence < events[1].sequence
        resumed = await first_events(client, 1, session_id=session_id, after_sequence=events[0].sequence)
        assert resumed[0].sequence == events[1].sequence
        seen[kind] = [
            (e.type, e.session_message.message.role, e.session_message.message.content) for e in events
        ]
    assert seen["http"] == seen["local"] == seen["grpc"]


async def test_stream_admission_errors(clients: dict[str, Factory]) -> None:
    async def subscribe(client: ACPClient) -> Any:
        return await first_events(client, 1, event_type=["bogus"])

    result = await same_everywhere(clients, subscribe, "alice")
    assert result[:2] == ("error", "INVALID_PARAMS")
    forbidden = await same_everywhere(clients, lambda c: first_events(c, 1, namespace="default"), "bob")
    assert forbidden[1] == "AUTH_FORBIDDEN"
    anonymous = await same_everywhere(clients, lambda c: first_events(c, 1))
    assert anonymous[1] == "AUTH_REQUIRED"


async def test_a_stream_closed_before_its_first_item_is_released(
    remote: tuple[ServerProcess, Tokens],
) -> None:
    """Found by the contract suite: closing the items of a stream never read left the HTTP
    response (and its pooled connection) or the gRPC call open."""
    server, tokens = remote
    op = catalog.OPERATIONS["events.subscribe"]
    options = CallOptions(acp_version=None, token=tokens.tokens["alice"], request_id="r1")
    limits = httpx.Limits(max_connections=1)
    http = HTTPTransport(
        httpx.AsyncClient(base_url=server.http, timeout=httpx.Timeout(5, pool=2), limits=limits),
        owns_client=True,
    )
    grpc_transport = GrpcTransport.connect(server.grpc_target, timeout=10)
    try:
        for transport in (http, grpc_transport):
            for _ in range(3):
                items = await transport.open_stream(op, op.request_type(), options)
                await items.aclose()  # type: ignore[attr-defined]
                assert items.released  # type: ignore[attr-defined]
        # One pooled connection: it would still be taken by an unreleased response.
        assert await http.call(
            catalog.OPERATIONS["meta.version"], catalog.OPERATIONS["meta.version"].request_type(), options
        )
    finally:
        await http.close()
        await grpc_transport.close()


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize("wire", ["http", "grpc"])
async def test_a_server_that_cannot_be_reached_is_a_transport_error(wire: str) -> None:
    """Both transports say "unreachable" by type, still the INTERNAL_ERROR callers knew."""
    port = _closed_port()
    # Retried as by default, within a short deadline: the default's 20 s only slowed the suite.
    retry = RetryPolicy(deadline=0.5)
    transport: Transport = (
        HTTPTransport.connect(f"http://127.0.0.1:{port}", timeout=5, retry=retry)
        if wire == "http"
        else GrpcTransport.connect(f"127.0.0.1:{port}", timeout=5, retry=retry)
    )
    op = catalog.OPERATIONS["meta.version"]
    options = CallOptions(acp_version=None, token=None, request_id="r-1")
    try:
        with pytest.raises(TransportError) as raised:
            await transport.call(op, op.request_type(), options)
        assert raised.value.code == "INTERNAL_ERROR"
        assert isinstance(raised.value, ACPError)
    finally:
        await transport.close()


async def test_an_acp_error_is_not_a_transport_error(clients: dict[str, Factory]) -> None:
    """A server's own answer (no token here) is never taken for an unreachable server."""
    for make in clients.values():
        with pytest.raises(ACPError) as raised:
            await make().call("session.list")
        assert raised.value.code == "AUTH_REQUIRED"
        assert not isinstance(raised.value, TransportError)
