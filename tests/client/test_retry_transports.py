"""What each network transport retries, against real servers on loopback that fail on purpose:

- a refused connection never sent anything: every operation is retried, up to the attempts;
- a server that takes the request and drops it (HTTP: closes without answering; gRPC: answers
  UNAVAILABLE without ACP details) may have acted on it: a read-only operation is retried, a
  mutating one unless ``after_send`` is off (for a server that does not replay by request id);
  each retry carries the same request id.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.errors import TransportError
from cleveragents.acp.contract.retry import RetryPolicy
from cleveragents.acp.contract.transport import CallOptions, Transport

READ = catalog.OPERATIONS["session.list"]
WRITE = catalog.OPERATIONS["session.create"]
QUICK = RetryPolicy(attempts=3, backoff=0.01, max_backoff=0.02)
WIRES = ["http", "grpc"]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Dropper:
    """A server that takes every request and drops it; ``request_ids`` in arrival order."""

    address: str
    request_ids: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def _http_dropper() -> AsyncIterator[Dropper]:
    found: list[str] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        for line in head.decode("latin-1").split("\r\n"):
            name, _, value = line.partition(":")
            if name.lower() == "x-request-id":
                found.append(value.strip())
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield Dropper(f"http://127.0.0.1:{port}", found)
    finally:
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def _grpc_dropper() -> AsyncIterator[Dropper]:
    found: list[str] = []

    async def drop(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        found.append(dict(context.invocation_metadata() or ())["x-request-id"])
        await context.abort(grpc.StatusCode.UNAVAILABLE, "going away")

    handlers = {
        op.method: grpc.unary_unary_rpc_method_handler(
            drop, request_deserializer=op.request_type.FromString, response_serializer=bytes
        )
        for op in (READ, WRITE)
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(READ.service, handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield Dropper(f"127.0.0.1:{port}", found)
    finally:
        await server.stop(None)


DROPPERS: dict[str, Callable[[], contextlib.AbstractAsyncContextManager[Dropper]]] = {
    "http": _http_dropper,
    "grpc": _grpc_dropper,
}


def _transport(wire: str, address: str, policy: RetryPolicy) -> Transport:
    if wire == "http":
        return HTTPTransport.connect(address, timeout=10, retry=policy)
    return GrpcTransport.connect(address, timeout=10, retry=policy)


async def _fail(transport: Transport, op: catalog.Operation, options: CallOptions) -> TransportError:
    try:
        with pytest.raises(TransportError) as raised:
            await transport.call(op, op.request_type(), options)
    finally:
        await transport.close()
    return raised.value


def _options(request_id: str, retry: RetryPolicy | None = None) -> CallOptions:
    return CallOptions(acp_version=None, token="t", request_id=request_id, retry=retry)


@pytest.mark.parametrize("wire", WIRES)
async def test_a_refused_connection_is_retried_for_any_operation(wire: str) -> None:
    port = _closed_port()
    address = f"http://127.0.0.1:{port}" if wire == "http" else f"127.0.0.1:{port}"
    error = await _fail(_transport(wire, address, QUICK), WRITE, _options("r-refused"))
    assert (error.details["sent"], error.details["attempts"]) == (False, 3)
    # Per call, retrying can be turned off.
    error = await _fail(_transport(wire, address, QUICK), WRITE, _options("r-off", RetryPolicy.OFF))
    assert "attempts" not in error.details


@pytest.mark.parametrize("wire", WIRES)
async def test_a_dropped_request_is_retried_when_harmless(wire: str) -> None:
    async with DROPPERS[wire]() as dropper:
        # Mutating, may have happened, the server does not replay: not retried.
        no_replay = dataclasses.replace(QUICK, after_send=False)
        error = await _fail(_transport(wire, dropper.address, no_replay), WRITE, _options("w-1"))
        assert (error.details["sent"], error.details["attempts"]) == (True, 1)
        assert dropper.request_ids == ["w-1"]
        # Read-only: retried, with the same request id.
        dropper.request_ids.clear()
        error = await _fail(_transport(wire, dropper.address, QUICK), READ, _options("r-1"))
        assert error.details["attempts"] == 3
        assert dropper.request_ids == ["r-1"] * 3
        # Mutating, by default (the server replays by request id): retried, same id.
        dropper.request_ids.clear()
        error = await _fail(_transport(wire, dropper.address, QUICK), WRITE, _options("w-2"))
        assert dropper.request_ids == ["w-2"] * 3
