"""stdin and stdout for a Zed ACP agent: stdout carries JSON-RPC and nothing else.

``claim_stdout`` moves the real stdout to a descriptor of its own and points descriptor 1
(and ``sys.stdout``) at stderr, so a stray ``print``, a library's warning or a child process
writing to its inherited stdout lands among the diagnostics, never in the JSON-RPC stream.

``JsonRpcLines`` sits between stdin and the SDK's connection: a line that is not JSON, or
not a JSON-RPC request, notification or response, is answered here with the JSON-RPC error
(-32700 parse error, -32600 invalid request) and never reaches the SDK, which would log it
and drop it silently (or, for a JSON array, stop reading).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
from typing import Any

# A line longer than this is refused as an invalid request (the SDK's own limit is 50 MiB).
MAX_LINE_BYTES = 16 * 1024 * 1024


def claim_stdout() -> int:
    """A descriptor of the real stdout for JSON-RPC; descriptor 1 and ``sys.stdout`` now
    write to stderr."""
    sys.stdout.flush()
    rpc = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return rpc


class _Writer(asyncio.Protocol):
    def __init__(self) -> None:
        self._paused = False
        self._waiters: list[asyncio.Future[None]] = []

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def _drain_helper(self) -> None:
        if self._paused:
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter


async def open_writer(fd: int) -> asyncio.StreamWriter:
    loop = asyncio.get_running_loop()
    pipe = os.fdopen(fd, "wb", buffering=0)
    try:
        transport, protocol = await loop.connect_write_pipe(_Writer, pipe)
    except ValueError:
        # A regular file (stdout redirected to one): written synchronously, it never blocks long.
        return _FileWriter(pipe)  # type: ignore[return-value]
    return asyncio.StreamWriter(transport, protocol, None, loop)


class _FileWriter:
    """The few ``StreamWriter`` methods the SDK uses, over a regular file."""

    def __init__(self, pipe: Any) -> None:
        self._pipe = pipe

    def write(self, data: bytes) -> None:
        self._pipe.write(data)

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._pipe.close()

    def is_closing(self) -> bool:
        return bool(self._pipe.closed)

    async def wait_closed(self) -> None:
        return None


def _problem(line: bytes) -> dict[str, Any] | None:
    """The JSON-RPC error answering an unusable line, or None when the line is a message."""
    if len(line) > MAX_LINE_BYTES:
        return _error(None, -32600, "Invalid request", f"a message longer than {MAX_LINE_BYTES} bytes")
    try:
        message = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        return _error(None, -32700, "Parse error", f"not JSON: {exc}")
    if not isinstance(message, dict):
        return _error(
            None, -32600, "Invalid request", "a JSON-RPC message is a JSON object (batches are not used)"
        )
    ident = message.get("id")
    if ident is not None and not isinstance(ident, (str, int)):
        return _error(None, -32600, "Invalid request", "id must be a string or a number")
    if message.get("jsonrpc") != "2.0":
        return _error(ident, -32600, "Invalid request", 'jsonrpc must be "2.0"')
    method = message.get("method")
    if method is not None:
        if not isinstance(method, str):
            return _error(ident, -32600, "Invalid request", "method must be a string")
        if "params" in message and not isinstance(message["params"], (dict, list, type(None))):
            return _error(ident, -32600, "Invalid request", "params must be an object or an array")
        return None
    if "id" not in message or not ("result" in message or "error" in message):
        return _error(ident, -32600, "Invalid request", "neither a request, a notification nor a response")
    return None


def _error(ident: Any, code: int, message: str, details: str) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": ident,
        "error": {"code": code, "message": message, "data": {"details": details}},
    }


class JsonRpcLines:
    """Reads stdin line by line on a thread (a pipe, a file or a terminal alike), answers
    unusable lines itself and feeds the others to the reader the SDK's connection reads."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.reader = asyncio.StreamReader(limit=MAX_LINE_BYTES + 1024)
        self._writer = writer
        self._loop = asyncio.get_running_loop()

    def start(self, stream: Any = None) -> None:
        source = stream if stream is not None else sys.stdin.buffer
        threading.Thread(target=self._read, args=(source,), name="zed-acp-stdin", daemon=True).start()

    def _read(self, source: Any) -> None:
        try:
            while True:
                line = source.readline(MAX_LINE_BYTES + 1)
                if not line:
                    break
                if len(line) > MAX_LINE_BYTES and not line.endswith(b"\n"):
                    # The rest of an overlong line is read and dropped.
                    while (rest := source.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                        pass
                self._loop.call_soon_threadsafe(self._accept, line)
        except (OSError, ValueError):
            pass
        finally:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self.reader.feed_eof)

    def _accept(self, line: bytes) -> None:
        if not line.strip():
            return
        problem = _problem(line.strip())
        if problem is None:
            self.reader.feed_data(line if line.endswith(b"\n") else line + b"\n")
            return
        sys.stderr.write(
            f"agents editor: refused a line from the client: {problem['error']['data']['details']}\n"
        )
        self._writer.write((json.dumps(problem) + "\n").encode())
