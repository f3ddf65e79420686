"""Text pieces on their way to the event log, in order, without holding up the stream.

The stream's reader pushes each piece as it arrives; one emitter task publishes them. While a
publish is in flight, the pieces that arrive meanwhile wait and go out together in the next
one: the first piece goes out at once, and a slow store means fewer, longer events, never a
stream that waits on the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

# Publishes one piece: (index within the turn, text).
Emit = Callable[[int, str], Awaitable[None]]


class DeltaPump:
    def __init__(self, emit: Emit) -> None:
        self._emit = emit
        self._parts: list[str] = []
        self._wake = asyncio.Event()
        self._closing = False
        self._holding = False
        self.count = 0
        self._task = asyncio.get_running_loop().create_task(self._run(), name="model-deltas")

    @property
    def pending(self) -> bool:
        return bool(self._parts)

    def push(self, text: str) -> None:
        if text:
            self._parts.append(text)
            self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._parts and not self._holding:
                text = "".join(self._parts)
                self._parts.clear()
                await self._emit(self.count, text)
                self.count += 1
            if self._closing and (self._holding or not self._parts):
                return

    async def close(self) -> None:
        """Publish what is still waiting, then stop."""
        self._closing = True
        self._wake.set()
        await self._task

    async def hold(self) -> tuple[int, str] | None:
        """Stop once the publish in flight is done, and hand back what still waits, unpublished,
        as (index, text): the caller publishes it in its next write, which saves a write (and
        its fsync) at the end of every turn."""
        self._closing = True
        self._holding = True
        self._wake.set()
        await self._task
        if not self._parts:
            return None
        text = "".join(self._parts)
        self._parts.clear()
        self.count += 1
        return self.count - 1, text

    def abandon(self) -> None:
        """Stop without publishing what waits (the call failed in a way that leaves no turn)."""
        self._task.cancel()
