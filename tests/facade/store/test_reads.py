"""The store's read lane: answers, errors and cancellations reach the right caller."""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

import pytest

from cleveragents.acp.facade.store.reads import BATCH, Outcome, ReadLane


def _numbered(n: int) -> tuple[int, int]:
    return n, threading.get_ident()


async def test_every_read_gets_its_own_answer_from_a_reader_thread() -> None:
    lane = ReadLane(2, "test-read")
    loop_thread = threading.get_ident()
    try:
        answers = await asyncio.gather(*(lane.run(functools.partial(_numbered, n)) for n in range(3 * BATCH)))
    finally:
        lane.close()
    assert [n for n, _ in answers] == list(range(3 * BATCH))
    assert loop_thread not in {thread for _, thread in answers}


async def test_an_error_reaches_only_its_caller() -> None:
    lane = ReadLane(1, "test-read")

    def fails() -> int:
        raise KeyError("missing")

    try:
        results = await asyncio.gather(
            lane.run(lambda: 1), lane.run(fails), lane.run(lambda: 3), return_exceptions=True
        )
    finally:
        lane.close()
    assert results[0] == 1
    assert isinstance(results[1], KeyError)
    assert results[2] == 3


class _Doubled:
    """A read answered together with the others of its batch (``together``)."""

    def __init__(self, n: int, together: Any) -> None:
        self.n = n
        self.together = together

    def __call__(self) -> int:
        raise AssertionError("a call with ``together`` is answered by it, never alone")


async def test_reads_with_the_same_together_are_answered_in_one_call_of_it() -> None:
    groups: list[list[int]] = []

    def doubled(calls: list[_Doubled]) -> list[Outcome]:
        groups.append([call.n for call in calls])
        return [(KeyError(call.n), None) if call.n == 3 else (None, 2 * call.n) for call in calls]

    def broken(calls: list[_Doubled]) -> list[Outcome]:
        raise OSError("disk")

    lane = ReadLane(1, "test-read")
    try:
        results = await asyncio.gather(
            *(lane.run(_Doubled(n, doubled)) for n in range(6)),
            lane.run(lambda: "plain"),
            *(lane.run(_Doubled(n, broken)) for n in range(2)),
            return_exceptions=True,
        )
    finally:
        lane.close()
    assert results[:3] == [0, 2, 4]
    assert isinstance(results[3], KeyError)
    assert results[4:7] == [8, 10, "plain"]
    assert all(isinstance(result, OSError) for result in results[7:])
    # Held until the loop ran out of ready work, the six went to one call.
    assert groups == [list(range(6))]


async def test_a_cancelled_caller_does_not_disturb_the_others() -> None:
    lane = ReadLane(1, "test-read")
    release = threading.Event()
    try:
        blocked = asyncio.ensure_future(lane.run(lambda: release.wait(5)))
        gone = asyncio.ensure_future(lane.run(lambda: "late"))
        kept = asyncio.ensure_future(lane.run(lambda: "kept"))
        await asyncio.sleep(0)
        gone.cancel()
        release.set()
        assert await blocked is True
        assert await kept == "kept"
        assert gone.cancelled()
    finally:
        lane.close()


async def test_close_finishes_queued_reads_then_refuses_new_ones() -> None:
    lane = ReadLane(2, "test-read")
    queued = [asyncio.ensure_future(lane.run(functools.partial(int, n))) for n in range(10)]
    await asyncio.sleep(0)
    await asyncio.to_thread(lane.close)
    assert await asyncio.gather(*queued) == list(range(10))
    with pytest.raises(RuntimeError, match="closed"):
        await lane.run(lambda: 0)
    assert not any(thread.name.startswith("test-read") for thread in threading.enumerate())


def test_a_lane_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        ReadLane(0, "test-read")


async def test_reads_one_after_another_are_answered_by_one_thread() -> None:
    """At an ordinary load the helpers stay asleep: no second thread wakes and contends."""
    lane = ReadLane(3, "test-read")
    try:
        threads = {(await lane.run(functools.partial(_numbered, n)))[1] for n in range(50)}
    finally:
        lane.close()
    assert len(threads) == 1


async def test_a_read_stuck_behind_a_slow_one_is_taken_by_a_helper() -> None:
    lane = ReadLane(2, "test-read", stall=0.001)
    started, release = threading.Event(), threading.Event()

    def slow() -> int:
        started.set()
        release.wait(30)
        return threading.get_ident()

    try:
        blocked = asyncio.ensure_future(lane.run(slow))
        assert await asyncio.to_thread(started.wait, 30)
        # Waiting behind the slow read: answered while that one still runs.
        helped = await asyncio.wait_for(lane.run(threading.get_ident), 30)
        assert not blocked.done()
        release.set()
        assert await blocked != helped
    finally:
        release.set()
        lane.close()
