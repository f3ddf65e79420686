"""A fake OpenAI-compatible chat-completions server for tests and benchmarks: a real HTTP/1.1
server on 127.0.0.1 (ephemeral port) speaking the wire format model servers speak — JSON
bodies, SSE streams of ``chat.completion.chunk`` objects sent with chunked transfer encoding
and ended by ``data: [DONE]``, ``tool_calls`` deltas split over chunks, ``usage`` in a last
chunk with empty ``choices`` when the request asks ``stream_options.include_usage``, error
bodies ``{"error": {...}}`` with ``Retry-After`` — and the ways real ones fail: a stream cut
off, a malformed chunk, a server that hangs.

Each test scripts the answers, one per request, in order (``then``); the requests are kept
(``requests``) to check what the client sent. ``repeat`` answers every request once the script
is spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

MODEL = "fake-model"
# How long a ``linger`` stream keeps its connection open after ``[DONE]``.
HANG_AFTER_DONE = 30.0


# answers ----------------------------------------------------------------------------------


@dataclass
class Stream:
    """An SSE answer. ``chunks`` are objects (sent as JSON) or raw ``data:`` payload text.
    ``end``: ``done`` sends ``[DONE]``; ``eof`` ends the body without it; ``reset`` drops the
    connection in the middle of the body; ``linger`` sends ``[DONE]`` but never ends the body
    (the connection stays open, silent, for ``HANG_AFTER_DONE`` seconds)."""

    chunks: Sequence[dict[str, Any] | str]
    delay: float = 0.0
    first_delay: float = 0.0
    end: str = "done"
    # Answer only once this is set (a test holds a call in flight for as long as it needs).
    hold: asyncio.Event | None = None
    # With ``hold``: send this many chunks first, then wait for it (a stream held midway).
    hold_after: int = 0


@dataclass
class Json:
    body: dict[str, Any]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Hang:
    """Send nothing for ``seconds`` (then drop the connection)."""

    seconds: float


def error(status: int, message: str, *, kind: str = "server_error", retry_after: str | None = None) -> Json:
    headers = {"retry-after": retry_after} if retry_after is not None else {}
    return Json({"error": {"message": message, "type": kind, "param": None, "code": None}}, status, headers)


Answer = Stream | Json | Hang


# chunks -----------------------------------------------------------------------------------


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": MODEL,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def split(text: str, pieces: int) -> list[str]:
    size = max(1, -(-len(text) // max(1, pieces)))
    return [text[i : i + size] for i in range(0, len(text), size)]


def tool_call_chunks(
    index: int, call_id: str, name: str, arguments: str, pieces: int = 3
) -> list[dict[str, Any]]:
    """The way servers stream a call: id and name first, then the arguments in pieces."""
    first = {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}
    out = [chunk({"tool_calls": [first]})]
    out.extend(
        chunk({"tool_calls": [{"index": index, "function": {"arguments": p}}]})
        for p in split(arguments, pieces)
    )
    return out


def turn(
    text: str = "",
    calls: Iterable[tuple[str, dict[str, Any] | str]] = (),
    *,
    pieces: int = 3,
    tokens: tuple[int, int] | None = (100, 20),
    delay: float = 0.0,
    first_delay: float = 0.0,
    call_ids: Sequence[str] = (),
) -> Stream:
    """One streamed answer: text in ``pieces``, then tool calls (name, arguments as an object
    or raw text), a finish chunk, and usage (``tokens`` = prompt, completion)."""
    chunks: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": ""})]
    chunks.extend(chunk({"content": p}) for p in split(text, pieces))
    listed = list(calls)
    for i, (name, args) in enumerate(listed):
        raw = args if isinstance(args, str) else json.dumps(args)
        call_id = call_ids[i] if i < len(call_ids) else f"call_{i + 1}_{abs(hash((name, raw))) % 10**8}"
        chunks.extend(tool_call_chunks(i, call_id, name, raw, pieces))
    chunks.append(chunk({}, "tool_calls" if listed else "stop"))
    if tokens is not None:
        chunks.append(usage(*tokens))
    return Stream(chunks, delay=delay, first_delay=first_delay)


# the server -------------------------------------------------------------------------------


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
}


async def eventually(check: Callable[[], object], seconds: float = 10.0) -> None:
    """Wait (bounded) until ``check()`` is true."""
    deadline = time.monotonic() + seconds
    for _ in itertools.count():
        if check():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"still not true after {seconds} s")
        await asyncio.sleep(0.01)


class FakeOpenAI:
    def __init__(self, port: int = 0) -> None:
        self.script: deque[Answer] = deque()
        self.repeat: Answer | None = None
        self.requests: list[Request] = []
        # Connections the client closed before the answer was complete.
        self.dropped = 0
        # Connections the client opened.
        self.connections = 0
        # Seconds spent producing answers (benchmarks subtract it).
        self.busy_seconds = 0.0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        # 0: an ephemeral port; a fixed one lets a server started earlier allow its URL.
        self.port = port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def then(self, *answers: Answer) -> FakeOpenAI:
        self.script.extend(answers)
        return self

    def bodies(self) -> list[Any]:
        return [r.body for r in self.requests]

    async def start(self) -> FakeOpenAI:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._writers):
                writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def __aenter__(self) -> FakeOpenAI:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def start_in_thread(self) -> FakeOpenAI:
        """Serve from a thread of its own (benchmarks: off the measured event loop)."""
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            loop.run_until_complete(self.start())
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self.close())
            loop.close()

        self._thread = threading.Thread(target=run, name="fake-openai", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop_thread(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    # HTTP ---------------------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            while True:
                request = await self._read(reader)
                if request is None:
                    return
                self.requests.append(request)
                answer = self.script.popleft() if self.script else self.repeat
                if answer is None:
                    answer = error(500, "the fake server has no answer scripted for this request")
                if not await self._answer(answer, writer, reader):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            self.dropped += 1
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _read(self, reader: asyncio.StreamReader) -> Request | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, value = line.split(":", 1)
                headers[name.strip().lower()] = value.strip()
        data = await reader.readexactly(int(headers.get("content-length", "0")))
        body = json.loads(data) if data else None
        return Request(method, path, headers, body)

    async def _held(self, hold: asyncio.Event, reader: asyncio.StreamReader | None) -> bool:
        """Wait for ``hold``; False (counted in ``dropped``) when the client closes the
        connection first (a cancelled model call: what ``session.cancel_turn`` must do)."""
        if reader is None:
            await hold.wait()
            return True
        released = asyncio.ensure_future(hold.wait())
        eof = asyncio.ensure_future(reader.read(1))
        done, _ = await asyncio.wait({released, eof}, return_when=asyncio.FIRST_COMPLETED)
        if released in done:
            eof.cancel()
            # Let the cancelled read end before the connection's next read starts.
            await asyncio.gather(eof, return_exceptions=True)
            return True
        released.cancel()
        self.dropped += 1
        return False

    async def _answer(
        self, answer: Answer, writer: asyncio.StreamWriter, reader: asyncio.StreamReader | None = None
    ) -> bool:
        """Write one answer; False when the connection is to be dropped."""
        started = time.perf_counter()
        if isinstance(answer, Hang):
            await asyncio.sleep(answer.seconds)
            return False
        if isinstance(answer, Json):
            payload = json.dumps(answer.body).encode()
            head = [
                f"HTTP/1.1 {answer.status} {_REASONS.get(answer.status, 'Status')}",
                "content-type: application/json",
                f"content-length: {len(payload)}",
            ]
            head.extend(f"{k}: {v}" for k, v in answer.headers.items())
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)
            await writer.drain()
            self.busy_seconds += time.perf_counter() - started
            return True
        if answer.hold is not None and not answer.hold_after:
            if not await self._held(answer.hold, reader):
                return False
            started = time.perf_counter()
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        busy = time.perf_counter() - started
        if answer.first_delay:
            await writer.drain()
            await asyncio.sleep(answer.first_delay)
        for index, item in enumerate(answer.chunks):
            if index and answer.delay:
                await asyncio.sleep(answer.delay)
            if answer.hold is not None and answer.hold_after and index == answer.hold_after:
                await writer.drain()
                if not await self._held(answer.hold, reader):
                    return False
            mark = time.perf_counter()
            # Raw chunks may carry {now}: the time they are written (benchmarks).
            data = (
                item.replace("{now}", str(time.perf_counter_ns()))
                if isinstance(item, str)
                else json.dumps(item)
            )
            frame = f"data: {data}\n\n".encode()
            writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            await writer.drain()
            busy += time.perf_counter() - mark
        if answer.end == "reset":
            writer.transport.abort()
            return False
        mark = time.perf_counter()
        if answer.end in ("done", "linger"):
            frame = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
        if answer.end == "linger":
            await writer.drain()
            await asyncio.sleep(HANG_AFTER_DONE)
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        self.busy_seconds += busy + time.perf_counter() - mark
        return True
