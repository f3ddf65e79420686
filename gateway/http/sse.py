"""The SSE response of a server stream (pure ASGI: it streams, and hears the client leave).

It is only built once the stream is admitted, so headers never go out before an early
error. Then: a comment right away (clients see the headers), one frame per item (frames
already available go out together, in one write), a keep-alive comment after each idle
interval, and on an error one ``event: error`` frame with the error envelope and the last
sequence delivered. It ends when the stream ends, the client leaves, or the server shuts
down.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import AsyncIterator, Iterator

from google.protobuf import message
from starlette.types import Receive, Scope, Send

from cleveragents.acp.contract import sse
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError, internal_error
from cleveragents.acp.gateway.http.responses import Exchange
from cleveragents.acp.gateway.streams import Tick, batches

log = logging.getLogger(__name__)

# Frames already available go out together, up to about this many bytes per write.
CHUNK_BYTES = 64 * 1024
# Items read ahead while a write is under way, by their proto size (JSON frames are
# larger): about one chunk, and little beyond the event log's own queue for a stalled client.
READ_AHEAD_BYTES = 24 * 1024
KEEPALIVE = sse.comment("keep-alive")

# SSE streams open per operation: with one, no other stream shares its items' frames.
_OPEN: collections.Counter[str] = collections.Counter()


def _proto_size(item: message.Message) -> int:
    return item.ByteSize()


class SSEResponse:
    def __init__(
        self,
        op: Operation,
        items: AsyncIterator[message.Message],
        exchange: Exchange,
        *,
        keepalive_seconds: float,
        closing: asyncio.Event,
    ) -> None:
        self.op = op
        self.items = items
        self.exchange = exchange
        self.keepalive_seconds = keepalive_seconds
        self.closing = closing
        self.last_sequence: int | None = None

    def _headers(self) -> list[tuple[bytes, bytes]]:
        headers = {
            **self.exchange.headers(),
            "Content-Type": "text/event-stream; charset=utf-8",
            "X-Accel-Buffering": "no",
        }
        return [(key.lower().encode(), value.encode("latin-1")) for key, value in headers.items()]

    def _chunks(self, items: list[message.Message]) -> Iterator[bytes]:
        """The frames of ``items``, joined into chunks of about CHUNK_BYTES: one write each."""
        frames: list[bytes] = []
        size = 0
        shared = _OPEN[self.op.name] > 1
        for item in items:
            frame, sequence = sse.encode(self.op, item, shared)
            self.last_sequence = sequence or self.last_sequence
            frames.append(frame)
            size += len(frame)
            if size >= CHUNK_BYTES:
                yield b"".join(frames)
                frames, size = [], 0
        if frames:
            yield b"".join(frames)

    def _error_frame(self, err: ACPError) -> bytes:
        details = dict(err.details)
        details.setdefault("last_sequence", self.last_sequence or 0)
        return sse.error_frame(self.exchange.error_envelope(ACPError(err.code, err.message, details)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        left = asyncio.Event()

        async def watch_disconnect() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            left.set()

        watcher = asyncio.ensure_future(watch_disconnect())
        _OPEN[self.op.name] += 1
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self._headers()})
            await send({"type": "http.response.body", "body": sse.comment("stream open"), "more_body": True})
            try:
                async for batch in batches(
                    self.items,
                    [left, self.closing],
                    tick=self.keepalive_seconds,
                    read_ahead=READ_AHEAD_BYTES,
                    weigh=_proto_size,
                ):
                    if isinstance(batch, Tick):
                        await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
                        continue
                    for chunk in self._chunks(batch):
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except ACPError as err:
                chunk = self._error_frame(err)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except Exception as exc:
                chunk = self._error_frame(internal_error(exc, f"{self.op.name} (SSE)"))
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if not left.is_set():
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            log.debug("SSE client of %s left", self.op.name)
        finally:
            _OPEN[self.op.name] -= 1
            watcher.cancel()
