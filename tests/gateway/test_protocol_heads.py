"""How ``GuardedProtocol`` reads a request's head on httptools (``gateway/http/protocol.py``),
which keeps a header that never ends and has no size limit of its own: a head over
``max_header_bytes`` is refused with the envelope whether it comes in many reads (refused
before it ends) or in one (measured once whole), and a small head is not refused for the body
that came in the same read. A method httptools does not know (h11 took any token) is
NOT_FOUND, as the application answers a method no route serves. In process, on a transport
that records what is written."""

from __future__ import annotations

from typing import Any

import orjson
from uvicorn.config import Config
from uvicorn.server import ServerState

from cleveragents.acp.gateway.http.protocol import Clients, ConnectionLimits, GuardedProtocol
from tests.gateway.test_protocol_writes import _JSON, _answer, _Transport, _turns

LIMIT = 1024


def _guarded(app: Any) -> tuple[GuardedProtocol, _Transport]:
    config = Config(app, lifespan="off", log_level="critical", server_header=False, date_header=False)
    config.load()
    bounds = ConnectionLimits(max_header_bytes=LIMIT)
    protocol = GuardedProtocol(config, ServerState(), {}, bounds=bounds, clients=Clients())
    transport = _Transport()
    protocol.connection_made(transport)
    return protocol, transport


def _refused_headers(transport: _Transport) -> None:
    head, _, body = b"".join(transport.writes).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 422 "), head
    error = orjson.loads(body)["error"]
    assert error["code"] == "INVALID_PARAMS"
    assert error["details"] == {"field": "headers", "max_bytes": LIMIT}


def _never_called(scope: Any, receive: Any, send: Any) -> Any:
    raise AssertionError("a refused request reached the application")


async def test_a_head_over_the_limit_in_one_read_is_refused() -> None:
    protocol, transport = _guarded(_never_called)
    protocol.data_received(b"GET /x HTTP/1.1\r\nHost: t\r\nX-Big: " + b"a" * 2 * LIMIT + b"\r\n\r\n")
    await _turns()
    _refused_headers(transport)
    protocol.connection_lost(None)


async def test_a_head_that_never_ends_is_refused_once_past_the_limit() -> None:
    protocol, transport = _guarded(_never_called)
    protocol.data_received(b"GET /x HTTP/1.1\r\nHost: t\r\nX-Big: ")
    sent = 0
    while not transport.writes:
        assert sent <= LIMIT + 300, "not refused past the limit"
        protocol.data_received(b"a" * 300)
        sent += 300
    _refused_headers(transport)
    protocol.connection_lost(None)


async def test_a_small_head_is_not_refused_for_the_body_in_the_same_read() -> None:
    received: list[bytes] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        received.append(message["body"])
        await _answer(200, _JSON, b"{}")(scope, receive, send)

    protocol, transport = _guarded(app)
    body = b"b" * 4 * LIMIT
    protocol.data_received(b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    await _turns()
    assert received == [body]
    assert len(transport.writes) == 1
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    protocol.connection_lost(None)


async def test_a_method_httptools_does_not_know_is_not_found() -> None:
    protocol, transport = _guarded(_never_called)
    protocol.data_received(b"BREW /api/v1/acp%20x?q=1 HTTP/1.1\r\nHost: t\r\n\r\n")
    await _turns()
    head, _, body = b"".join(transport.writes).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404 "), head
    error = orjson.loads(body)["error"]
    assert error["code"] == "NOT_FOUND"
    assert error["details"] == {"path": "/api/v1/acp x", "method": "BREW"}
    protocol.connection_lost(None)
