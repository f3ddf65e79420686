"""SSE frames are shared between the streams open at once, and not kept with one open."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

from cleveragents.acp.contract import catalog, sse
from cleveragents.acp.gateway.http import sse as http_sse
from cleveragents.acp.gateway.http.responses import Exchange
from cleveragents.acp.v1 import events_pb2

OP = catalog.OPERATIONS["events.subscribe"]


def _item(sequence: int) -> events_pb2.SubscribeEventsResponse:
    event = events_pb2.Event(sequence=sequence, type="session.message", session_id="s1")
    event.session_message.message.content = "shared"
    return events_pb2.SubscribeEventsResponse(event=event)


async def _items(items: list[events_pb2.SubscribeEventsResponse], hold: asyncio.Event) -> AsyncIterator[Any]:
    for item in items:
        yield item
    await hold.wait()


async def _stream(items: list[Any], hold: asyncio.Event, sent: asyncio.Event) -> None:
    """Streams ``items`` until ``hold`` is set; ``sent`` once the first item's frame went out."""
    left = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message.get("body", b"").startswith(b"id: "):
            sent.set()

    response = http_sse.SSEResponse(OP, _items(items, hold), Exchange(), keepalive_seconds=30, closing=hold)
    await response({"type": "http"}, receive, send)


def _kept(item: Any) -> bool:
    found = sse._shape(OP).frames.get(id(item))
    return found is not None and found[0] is item


async def test_frames_are_kept_only_while_another_stream_is_open() -> None:
    alone, together = [_item(1)], [_item(2)]
    hold = asyncio.Event()
    sent_alone, sent_together = asyncio.Event(), asyncio.Event()
    first = asyncio.ensure_future(_stream(alone, hold, sent_alone))
    await asyncio.wait_for(sent_alone.wait(), 10)
    assert not _kept(alone[0])
    second = asyncio.ensure_future(_stream(together, hold, sent_together))
    await asyncio.wait_for(sent_together.wait(), 10)
    assert _kept(together[0])
    assert http_sse._OPEN[OP.name] == 2
    hold.set()
    await asyncio.gather(first, second)
    assert http_sse._OPEN[OP.name] == 0
