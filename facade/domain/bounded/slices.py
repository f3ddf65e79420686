"""Long CPU work done in slices, so one caller's big input does not hold the event loop.

Such work is written once, as a generator that yields between slices; ``run`` drives it
to the end at once (for callers off the loop), ``run_sliced`` gives the loop back at each
yield (a 30,000-message session import lets every other call through between its
chunks)."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import TypeVar

T = TypeVar("T")

# Items (messages, rows) of work between two yields.
SLICE = 500

Sliced = Generator[None, None, T]


def run(work: Sliced[T]) -> T:
    while True:
        try:
            next(work)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


async def run_sliced(work: Sliced[T]) -> T:
    while True:
        try:
            next(work)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await asyncio.sleep(0)
