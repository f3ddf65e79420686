"""A webhook receiver on loopback for the tests and the bench: a real HTTP/1.1 server
(asyncio streams) that keeps every request it gets and answers as the test says."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    # time.time() when the whole request was read.
    at: float
    status: int = 0


Answer = Callable[
    [Received], Awaitable[tuple[int, bytes, dict[str, str]]] | tuple[int, bytes, dict[str, str]]
]


def accept(_: Received) -> tuple[int, bytes, dict[str, str]]:
    return 200, b"ok", {}


@dataclass
class Receiver:
    answer: Answer = accept
    host: str = "127.0.0.1"
    requests: list[Received] = field(default_factory=list)
    connections: int = 0
    got: asyncio.Event = field(default_factory=asyncio.Event)
    _server: asyncio.base_events.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def url(self, path: str = "/hook") -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}{path}"

    async def __aenter__(self) -> Receiver:
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                name, sep, value = line.partition(":")
                if sep:
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            got = Received(headers, body, time.time())
            answered = self.answer(got)
            if not isinstance(answered, tuple):
                answered = await answered
            status, content, extra = answered
            got.status = status
            self.requests.append(got)
            self.got.set()
            more = "".join(f"{k}: {v}\r\n" for k, v in extra.items())
            answer_head = (
                f"HTTP/1.1 {status} X\r\nContent-Length: {len(content)}\r\n{more}Connection: close\r\n\r\n"
            )
            writer.write(answer_head.encode() + content)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def wait_for(self, predicate: Callable[[], bool], seconds: float = 30.0) -> None:
        async with asyncio.timeout(seconds):
            while not predicate():
                self.got.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.got.wait(), 0.2)
