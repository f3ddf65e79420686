"""DeltaPump: pieces go out in order, and ``hold`` hands back, unpublished, what waits behind
the publish in flight (a plan publishes it in the write of the turn's decisions)."""

from __future__ import annotations

import asyncio

from cleveragents.acp.facade.domain.models.deltas import DeltaPump


async def test_hold_waits_for_the_publish_in_flight_and_hands_back_what_waits_behind_it() -> None:
    published: list[tuple[int, str]] = []
    started = asyncio.Event()
    release = asyncio.Event()

    async def emit(index: int, text: str) -> None:
        published.append((index, text))
        started.set()
        await release.wait()

    pump = DeltaPump(emit)
    pump.push("The first piece")
    await started.wait()
    pump.push(", then ")
    pump.push("the rest.")
    holding = asyncio.ensure_future(pump.hold())
    await asyncio.sleep(0)
    assert not holding.done()
    release.set()
    assert await holding == (1, ", then the rest.")
    assert published == [(0, "The first piece")]
    assert pump.count == 2
    assert not pump.pending


async def test_hold_hands_back_nothing_when_everything_was_published() -> None:
    published: list[tuple[int, str]] = []
    done = asyncio.Event()

    async def emit(index: int, text: str) -> None:
        published.append((index, text))
        done.set()

    pump = DeltaPump(emit)
    pump.push("All of it.")
    await done.wait()
    assert await pump.hold() is None
    assert published == [(0, "All of it.")]


async def test_close_publishes_what_waits() -> None:
    published: list[tuple[int, str]] = []

    async def emit(index: int, text: str) -> None:
        published.append((index, text))

    pump = DeltaPump(emit)
    pump.push("One")
    pump.push(" two.")
    await pump.close()
    assert published == [(0, "One two.")]
