"""The stream pump both front ends use: batches, ticks, stops, errors, and the source
always closed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator

import pytest

from cleveragents.acp.contract.batched import Batched
from cleveragents.acp.gateway.streams import TICK, batches, until_stopped


class Source:
    """An async generator's stand-in that records whether it was closed."""

    def __init__(self, items: list[int], *, then: BaseException | None = None, hang: bool = False) -> None:
        self.items = items
        self.then = then
        self.hang = hang
        self.closed = False
        self.release = asyncio.Event()

    async def _gen(self) -> AsyncIterator[int]:
        try:
            for item in self.items:
                yield item
            if self.hang:
                await self.release.wait()
            if self.then is not None:
                raise self.then
        finally:
            self.closed = True

    def __call__(self) -> AsyncIterator[int]:
        return self._gen()


async def test_items_already_available_come_as_one_batch() -> None:
    source = Source(list(range(10)))
    found = [batch async for batch in batches(source(), [], read_ahead=100)]
    assert found == [list(range(10))]
    assert source.closed


async def batch_source(batches: list[list[int]]) -> AsyncGenerator[list[int], None]:
    for batch in batches:
        yield batch


async def test_a_batched_source_is_read_a_batch_at_a_time_and_closed() -> None:
    source = Batched(batch_source([[0, 1, 2], [], [3], [4, 5]]))
    found = [batch async for batch in batches(source, [], read_ahead=1)]
    assert found == [[0, 1, 2], [3], [4, 5]]
    one_by_one = Batched(batch_source([[0, 1], [2]]))
    assert [item async for item in one_by_one] == [0, 1, 2]
    with pytest.raises(StopAsyncIteration):
        await source.next_batch()


async def test_read_ahead_bounds_the_weight_of_a_batch() -> None:
    source = Source(list(range(10)))
    found = [
        batch
        async for batch in batches(source(), [], read_ahead=10, weigh=lambda item: item + 1)
        if isinstance(batch, list)
    ]
    assert found == [[0, 1, 2, 3], [4, 5], [6, 7], [8, 9]]


async def test_by_default_one_item_is_read_ahead() -> None:
    source = Source(list(range(3)))
    assert [batch async for batch in batches(source(), [])] == [[0], [1], [2]]


async def test_an_error_comes_after_the_items_before_it() -> None:
    source = Source([1, 2], then=ValueError("broken"))
    got: list[object] = []

    async def read() -> None:
        async for batch in batches(source(), [], read_ahead=100):
            got.append(batch)

    with pytest.raises(ValueError, match="broken"):
        await read()
    assert got == [[1, 2]]
    assert source.closed


async def test_idle_streams_tick_and_a_stop_ends_them() -> None:
    source = Source([1], hang=True)
    stop = asyncio.Event()
    got: list[object] = []
    async with asyncio.timeout(5):
        async for batch in batches(source(), [stop], tick=0.05):
            got.append(batch)
            if got.count(TICK) == 2:
                stop.set()
    assert got == [[1], TICK, TICK]
    assert source.closed


async def test_a_stop_set_while_waiting_ends_the_stream_at_once() -> None:
    source = Source([], hang=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.05, stop.set)
    async with asyncio.timeout(5):
        assert [batch async for batch in batches(source(), [stop])] == []
    assert source.closed


async def test_until_stopped_yields_items_one_by_one_and_closes_on_break() -> None:
    source = Source(list(range(5)), hang=True)
    got: list[object] = []
    async with asyncio.timeout(5):
        items = until_stopped(source(), [])
        async for item in items:
            got.append(item)
            if item == 4:
                break
        await items.aclose()  # type: ignore[attr-defined]
    assert got == [0, 1, 2, 3, 4]
    assert source.closed
