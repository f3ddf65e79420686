"""How ``GuardedProtocol`` puts answers on the wire (``gateway/http/protocol.py``): an answer
whose head declares its length and whose body follows whole (as every envelope's does) leaves
in one write; a stream's head leaves at once, before the stream's first item; a close while an
answer is held sends it first. Every answer leaves the same bytes, and leaves the connection in
the same state, as plain uvicorn on httptools (``HttpToolsProtocol``) would."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from cleveragents.acp.gateway.http.protocol import Clients, ConnectionLimits, GuardedProtocol

REQUEST = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.writes.append(bytes(data))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _connect(
    app: Any, *, plain: bool = False, defaults: list[tuple[bytes, bytes]] | None = None
) -> tuple[HttpToolsProtocol, _Transport]:
    """``plain``: uvicorn's own protocol, the reference the guarded one is compared with;
    ``defaults``: the headers uvicorn's server adds to every answer (date, server)."""
    config = Config(app, lifespan="off", log_level="critical", server_header=False, date_header=False)
    config.load()
    state = ServerState()
    state.default_headers = defaults or []
    protocol: HttpToolsProtocol
    if plain:
        protocol = HttpToolsProtocol(config, state, {})
    else:
        protocol = GuardedProtocol(config, state, {}, bounds=ConnectionLimits(), clients=Clients())
    transport = _Transport()
    protocol.connection_made(transport)
    return protocol, transport


async def _turns(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_an_answer_sent_at_once_is_one_write() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    protocol, transport = _connect(app)
    for _ in range(2):
        protocol.data_received(REQUEST)
        await _turns()
    assert len(transport.writes) == 2
    for written in transport.writes:
        assert written.startswith(b"HTTP/1.1 200 ")
        assert written.endswith(b"\r\n\r\nok")
    protocol.connection_lost(None)


async def test_a_streams_head_leaves_before_its_first_item() -> None:
    item = asyncio.Event()

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await item.wait()
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    protocol, transport = _connect(app)
    protocol.data_received(REQUEST)
    await _turns()
    assert len(transport.writes) == 1
    assert transport.writes[0].startswith(b"HTTP/1.1 200 ")
    assert transport.writes[0].endswith(b"\r\n\r\n")
    item.set()
    await _turns()
    assert b"first" in b"".join(transport.writes[1:])
    protocol.connection_lost(None)


async def test_a_close_sends_the_held_answer_first() -> None:
    """The application's ``connection: close`` makes uvicorn close within the answer's
    second send, while the answer is held: it leaves first, in one write."""
    protocol, transport = _connect(_answer(200, [*_JSON, (b"connection", b"close")], b"{}"))
    protocol.data_received(REQUEST)
    await _turns()
    assert len(transport.writes) == 1
    assert transport.writes[0].startswith(b"HTTP/1.1 200 OK\r\n")
    assert transport.writes[0].endswith(b"\r\nconnection: close\r\n\r\n{}")
    assert transport.closed
    protocol.connection_lost(None)


def _answer(status: int, headers: list[tuple[Any, Any]], body: bytes, *, more: bool = False) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": status, "headers": headers})
        if more:
            await send({"type": "http.response.body", "body": body, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            await send({"type": "http.response.body", "body": body})

    return app


_JSON = [(b"x-request-id", b"r1"), (b"content-length", b"2"), (b"content-type", b"application/json")]
_POST = b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\n\r\n"

# (request bytes, app); each case is served by both protocols and compared (uvicorn refuses
# the last few's headers: both then close without an answer, or answer 500).
_CASES = {
    "whole answer": (REQUEST, _answer(200, _JSON, b"{}")),
    "error status": (REQUEST, _answer(404, _JSON, b"{}")),
    "two pipelined": (REQUEST + REQUEST, _answer(200, _JSON, b"{}")),
    "posted body": (_POST + b"abcd", _answer(200, _JSON, b"{}")),
    "answered while the body is still coming": (_POST + b"ab", _answer(200, _JSON, b"{}")),
    "expect 100-continue": (
        b"POST /x HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n",
        _answer(200, _JSON, b"{}"),
    ),
    "client asks to close": (
        b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        _answer(200, _JSON, b"{}"),
    ),
    "HTTP/1.0": (b"GET /x HTTP/1.0\r\n\r\n", _answer(200, _JSON, b"{}")),
    "HEAD": (b"HEAD /x HTTP/1.1\r\nHost: t\r\n\r\n", _answer(200, _JSON, b"{}")),
    "unsupported upgrade": (
        b"GET /x HTTP/1.1\r\nHost: t\r\nConnection: upgrade\r\nUpgrade: h2c\r\n\r\n",
        _answer(200, _JSON, b"{}"),
    ),
    "app closes": (REQUEST, _answer(200, [*_JSON, (b"connection", b"close")], b"{}")),
    "mixed-case names": (REQUEST, _answer(200, [(b"X-Request-ID", b"r1"), (b"Content-Length", b"2")], b"{}")),
    "text headers": (REQUEST, _answer(200, [("content-length", "2")], b"{}")),
    "no content": (REQUEST, _answer(204, [(b"content-length", b"0")], b"")),
    "no length": (REQUEST, _answer(200, [(b"content-type", b"text/plain")], b"ok")),
    "body in two messages": (REQUEST, _answer(200, _JSON, b"{}", more=True)),
    "length too small": (REQUEST, _answer(200, [(b"content-length", b"1")], b"{}")),
    "length twice": (REQUEST, _answer(200, [(b"content-length", b"2"), (b"content-length", b"2")], b"{}")),
    "length with spaces": (REQUEST, _answer(200, [(b"content-length", b" 2")], b"{}")),
    "value with a line break": (
        REQUEST,
        _answer(200, [(b"x-a", b"1\r\nx-b: 2"), (b"content-length", b"2")], b"{}"),
    ),
    "value with trailing space": (REQUEST, _answer(200, [(b"x-a", b"1 "), (b"content-length", b"2")], b"{}")),
    "empty value": (REQUEST, _answer(200, [(b"x-a", b""), (b"content-length", b"2")], b"{}")),
    "bad name": (REQUEST, _answer(200, [(b"x a", b"1"), (b"content-length", b"2")], b"{}")),
    "name with a colon": (REQUEST, _answer(200, [(b"x: y", b"1"), (b"content-length", b"2")], b"{}")),
    "value with a newline": (
        REQUEST,
        _answer(200, [(b"x-a", b"1\nx-b: 2"), (b"content-length", b"2")], b"{}"),
    ),
    "value with a NUL": (REQUEST, _answer(200, [(b"x-a", b"1\x002"), (b"content-length", b"2")], b"{}")),
    "unknown status": (REQUEST, _answer(999, [(b"content-length", b"2")], b"{}")),
}


def _state(protocol: HttpToolsProtocol, transport: _Transport) -> tuple[Any, ...]:
    cycle = protocol.cycle
    return (
        b"".join(transport.writes),
        transport.closed,
        protocol.server_state.total_requests,
        len(protocol.pipeline),
        None
        if cycle is None
        else (
            cycle.response_started,
            cycle.response_complete,
            cycle.keep_alive,
            cycle.disconnected,
            cycle.waiting_for_100_continue,
            cycle.chunked_encoding,
            cycle.expected_content_length,
        ),
    )


@pytest.mark.parametrize("case", list(_CASES))
async def test_an_answer_it_writes_is_what_uvicorn_writes(case: str) -> None:
    request, app = _CASES[case]
    states = []
    for plain in (True, False):
        protocol, transport = _connect(app, plain=plain)
        protocol.data_received(request)
        await _turns()
        states.append(_state(protocol, transport))
        protocol.connection_lost(None)
    assert states[0] == states[1]


async def test_default_headers_come_first() -> None:
    states = []
    for plain in (True, False):
        defaults = [(b"date", b"Tue, 01 Dec 2026 16:00:00 GMT"), (b"server", b"uvicorn")]
        protocol, transport = _connect(_answer(200, _JSON, b"{}"), plain=plain, defaults=defaults)
        protocol.data_received(REQUEST)
        await _turns()
        states.append(_state(protocol, transport))
        protocol.connection_lost(None)
    assert states[0] == states[1]
    assert states[0][0].startswith(
        b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 16:00:00 GMT\r\nserver: uvicorn\r\n"
    )


async def test_a_whole_answer_is_one_write_of_uvicorns_bytes() -> None:
    protocol, transport = _connect(_answer(200, _JSON, b"{}"))
    for _ in range(2):
        protocol.data_received(REQUEST)
        await _turns()
    head = b"HTTP/1.1 200 OK\r\nx-request-id: r1\r\ncontent-length: 2\r\ncontent-type: application/json"
    assert transport.writes == [head + b"\r\n\r\n{}"] * 2
    protocol.connection_lost(None)
