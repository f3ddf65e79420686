"""Pumping a server stream until it ends, the peer leaves or the server shuts down.

Both front ends use it: SSE also wants a tick when the stream is idle (keep-alive), and
both end their streams cleanly on shutdown instead of waiting to be cancelled.

One pump task per stream reads the source into a bounded buffer, and the front end takes
whatever has accumulated as one batch: SSE sends a batch in one write instead of a system
call per item, and no item costs a task or an ``asyncio.wait`` of its own. A ``Batched``
source is read a batch at a time (the event log hands out what it holds at once). The pump
reads ahead of the front end by a bounded weight only (SSE: bytes; gRPC: one item; a
``Batched`` source: one batch), so a peer that stops reading still pushes back on the
source, and the event log still ends a subscriber that falls too far behind.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Generic, TypeVar

from cleveragents.acp.contract.batched import Batched, close_iterator, next_batch

T = TypeVar("T")


class Tick:
    """Yielded when no item arrived for ``tick`` seconds."""


TICK = Tick()


def _wake(waiter: asyncio.Future[bool] | None, timed_out: bool = False) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(timed_out)


class _Pump(Generic[T]):
    """Reads ``items`` in a task of its own into ``buffer`` until what it holds weighs
    ``limit`` (at least one item)."""

    def __init__(self, items: AsyncIterator[T], limit: int, weigh: Callable[[T], int] | None) -> None:
        self.items = items
        self.limit = limit
        self.weigh = weigh
        self.weight = 0
        self.buffer: deque[T] = deque()
        self.error: BaseException | None = None
        self.done = False
        # Resolved when the reader should look again (items, the end, a stop).
        self.waiter: asyncio.Future[bool] | None = None
        # Resolved when the reader took items out of a full buffer.
        self._room: asyncio.Future[None] | None = None
        self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        items, weigh, buffer = self.items, self.weigh, self.buffer
        # A batched source holds what is not read yet: one batch is all the pump reads ahead
        # (and its items are not weighed one by one).
        whole = isinstance(items, Batched)
        try:
            while True:
                try:
                    batch = await next_batch(items)
                except StopAsyncIteration:
                    break
                buffer.extend(batch)
                if whole:
                    self.weight = self.limit
                else:
                    self.weight += len(batch) if weigh is None else sum(map(weigh, batch))
                _wake(self.waiter)
                if self.weight >= self.limit:
                    self._room = asyncio.get_running_loop().create_future()
                    await self._room
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.error = exc
        finally:
            self.done = True
            _wake(self.waiter)

    def take(self) -> list[T]:
        taken = list(self.buffer)
        self.buffer.clear()
        self.weight = 0
        room = self._room
        if room is not None and not room.done():
            room.set_result(None)
        return taken

    async def stop(self) -> None:
        if not self.task.done():
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
        await close_iterator(self.items)


async def batches(
    items: AsyncIterator[T],
    stops: Sequence[asyncio.Event],
    *,
    tick: float | None = None,
    read_ahead: int = 1,
    weigh: Callable[[T], int] | None = None,
) -> AsyncGenerator[list[T] | Tick, None]:
    """Every item already read as one list, with a ``TICK`` after each idle ``tick``
    seconds, until the source ends (or raises, after the items before the error) or any
    stop is set. The pump reads ahead while the caller is busy until what it holds weighs
    ``read_ahead`` (``weigh`` of each item; without it, each item weighs 1). The source
    iterator is closed on every way out, so its subscription is released."""
    loop = asyncio.get_running_loop()
    pump = _Pump(items, read_ahead, weigh)
    watchers = [asyncio.ensure_future(stop.wait()) for stop in stops]
    for watcher in watchers:
        watcher.add_done_callback(lambda _: _wake(pump.waiter))
    try:
        while not any(stop.is_set() for stop in stops):
            if pump.buffer:
                yield pump.take()
                continue
            if pump.done:
                if pump.error is not None:
                    raise pump.error
                return
            pump.waiter = waiter = loop.create_future()
            timer = loop.call_later(tick, _wake, waiter, True) if tick is not None else None
            try:
                timed_out = await waiter
            finally:
                pump.waiter = None
                if timer is not None:
                    timer.cancel()
            if timed_out and not pump.buffer and not pump.done:
                yield TICK
    finally:
        for watcher in watchers:
            watcher.cancel()
        await pump.stop()


async def until_stopped(
    items: AsyncIterator[T], stops: Sequence[asyncio.Event], *, tick: float | None = None
) -> AsyncIterator[T | Tick]:
    """The items one by one, as ``batches`` reads them."""
    async with contextlib.aclosing(batches(items, stops, tick=tick)) as found:
        async for batch in found:
            if isinstance(batch, Tick):
                yield batch
                continue
            for item in batch:
                if any(stop.is_set() for stop in stops):
                    return
                yield item
