"""``Batched``: a server stream's items, readable one by one or in the batches they come in.

A stream is built of layers (the event log's subscription, the handler's responses, the
facade's guard, the observer's watch); each handling one item at a time cost an
async-generator step per layer per item, and per subscriber. The event log hands out every
event it holds at once, so each layer works per batch, and a front end that sends a batch
in one write (SSE) or pumps it (gRPC) reads ``next_batch``; a reader that wants items one
by one iterates as before.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Generic, TypeVar

__all__ = ["Batched", "close_iterator", "next_batch"]

T = TypeVar("T")


class Batched(Generic[T]):
    """The items of ``source``, an async generator of lists (an empty list is skipped)."""

    __slots__ = ("_ready", "_source")

    def __init__(self, source: AsyncGenerator[list[T], None]) -> None:
        self._source = source
        self._ready: deque[T] = deque()

    def __aiter__(self) -> Batched[T]:
        return self

    async def __anext__(self) -> T:
        ready = self._ready
        while not ready:
            ready.extend(await anext(self._source))
        return ready.popleft()

    async def next_batch(self) -> list[T]:
        """Every item ready now (at least one: it waits for one); StopAsyncIteration at the end."""
        if self._ready:
            taken = list(self._ready)
            self._ready.clear()
            return taken
        while True:
            batch = await anext(self._source)
            if batch:
                return batch

    async def aclose(self) -> None:
        self._ready.clear()
        await self._source.aclose()


async def next_batch(items: AsyncIterator[T]) -> list[T]:
    """The next batch of ``items``: a ``Batched`` stream's own, else the next item alone."""
    if isinstance(items, Batched):
        return await items.next_batch()
    return [await anext(items)]


async def close_iterator(items: AsyncIterator[object]) -> None:
    """Close ``items`` when it can be closed (an async generator, a ``Batched`` stream)."""
    aclose = getattr(items, "aclose", None)
    if aclose is not None:
        await aclose()
