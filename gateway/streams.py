"""Pumping a server stream until it ends, the peer leaves or the server shuts down.

Both front ends use it: SSE also wants a tick when the stream is idle (keep-alive), and
both end their streams cleanly on shutdown instead of waiting to be cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import TypeVar

T = TypeVar("T")


class Tick:
    """Yielded when no item arrived for ``tick`` seconds."""


TICK = Tick()
_END = object()


async def _next(items: AsyncIterator[T]) -> T | object:
    try:
        return await anext(items)
    except StopAsyncIteration:
        return _END


async def close_iterator(items: AsyncIterator[object]) -> None:
    aclose = getattr(items, "aclose", None)
    if aclose is not None:
        await aclose()


async def until_stopped(
    items: AsyncIterator[T], stops: Sequence[asyncio.Event], *, tick: float | None = None
) -> AsyncIterator[T | Tick]:
    """The items, with a ``TICK`` after each idle ``tick`` seconds, until any stop is set.

    The source iterator is closed on every way out, so its subscription is released."""
    waiters = [asyncio.ensure_future(stop.wait()) for stop in stops]
    pending: asyncio.Future[T | object] | None = None
    try:
        while True:
            pending = asyncio.ensure_future(_next(items))
            while True:
                done, _ = await asyncio.wait(
                    {pending, *waiters}, timeout=tick, return_when=asyncio.FIRST_COMPLETED
                )
                if pending in done:
                    break
                if done:
                    return
                yield TICK
            item = pending.result()
            pending = None
            if item is _END:
                return
            yield item  # type: ignore[misc]
    finally:
        for waiter in waiters:
            waiter.cancel()
        if pending is not None and not pending.done():
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        await close_iterator(items)
