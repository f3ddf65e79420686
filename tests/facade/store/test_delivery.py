"""CommitOrder: answers on the callers' loops, in commit order, one wake-up per loop while
one is on its way (store threads committing together do not each wake the loop)."""

from __future__ import annotations

import asyncio
import functools
import threading
from typing import Any

from cleveragents.acp.facade.store.delivery import CommitOrder, Job


async def test_jobs_due_while_a_drain_is_asked_share_it_and_answer_in_order() -> None:
    loop = asyncio.get_running_loop()
    order = CommitOrder()
    asked: list[object] = []
    real = loop.call_soon_threadsafe

    def counting(callback: Any, *args: Any) -> asyncio.Handle:
        asked.append(callback)
        return real(callback, *args)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign,assignment]
    seen: list[int] = []
    jobs = [Job(lambda _s: None, loop, 0.0) for _ in range(3)]
    for number, job in enumerate(jobs):
        job.result = number
        job.callbacks = [functools.partial(seen.append, number)]

    def commit() -> None:
        for job in jobs:
            order.due([job])
            order.announce([job])

    thread = threading.Thread(target=commit)
    thread.start()
    thread.join()
    assert len(asked) == 1
    assert [await job.future for job in jobs if job.future is not None] == [0, 1, 2]
    assert seen == [0, 1, 2]
    # Once that drain ran, the next commit asks again.
    late = Job(lambda _s: None, loop, 0.0)
    late.result = 3
    order.due([late])
    order.announce([late])
    assert len(asked) == 2
    assert late.future is not None
    assert await late.future == 3


def test_a_closed_loop_is_not_asked_and_does_not_stay_asked() -> None:
    loop = asyncio.new_event_loop()
    order = CommitOrder()
    job = Job(lambda _s: None, loop, 0.0)
    loop.close()
    order.due([job])
    order.announce([job])
    order.announce([job])
    assert loop not in order._asked
