"""How ``GuardedH11Protocol`` puts answers on the wire (``gateway/http/protocol.py``): an
answer sent at once (head and body in one turn of the loop, as every envelope is) leaves in
one write; a stream's head leaves by the next turn, before the stream's first item; a close
sends what is held first."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

from uvicorn.config import Config
from uvicorn.server import ServerState

from cleveragents.acp.gateway.http.protocol import ConnectionLimits, GuardedH11Protocol

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


def _connect(app: Any) -> tuple[GuardedH11Protocol, _Transport]:
    config = Config(app, lifespan="off", log_level="warning", server_header=False, date_header=False)
    config.load()
    protocol = GuardedH11Protocol(
        config, ServerState(), {}, bounds=ConnectionLimits(), per_client=collections.Counter()
    )
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


async def test_a_close_sends_the_held_head_first() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.Event().wait()

    protocol, transport = _connect(app)
    protocol.data_received(REQUEST)
    await _turns()
    protocol.transport.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    assert transport.writes == []
    protocol.transport.close()
    assert transport.writes == [b"HTTP/1.1 204 No Content\r\n\r\n"]
    assert transport.closed
    protocol.connection_lost(None)
