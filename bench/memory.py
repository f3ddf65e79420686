"""``rss_mib_10k_sessions``: the server's resident memory after it created 10,000
sessions and 1,000 plans (``plan.use`` of the scripted action), read from /proc."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from bench import plans
from bench.product import Product
from bench.run import Run

CONCURRENCY = 16


async def _in_batches(count: int, make: Callable[[int], Awaitable[object]]) -> None:
    for start in range(0, count, CONCURRENCY):
        await asyncio.gather(*(make(i) for i in range(start, min(count, start + CONCURRENCY))))


async def _populate(run: Run, product: Product) -> None:
    async with product.client() as client:
        await plans.set_up(client, run.scratch("memory/project"))

        async def session(index: int) -> object:
            return await client.call("session.create", title=f"session {index}", labels={"n": str(index)})

        async def plan(index: int) -> object:
            return await plans.use(client, f"m{index}")

        async with asyncio.timeout(600):
            await _in_batches(run.mode.sessions, session)
            await _in_batches(run.mode.plans, plan)


def run_all(run: Run) -> None:
    with Product(run.scratch("memory")) as product:
        run.note("rss_mib_idle", product.server.rss_mib())
        asyncio.run(_populate(run, product))
        run.note("rss_sessions", run.mode.sessions)
        run.note("rss_plans", run.mode.plans)
        run.record("rss_mib_10k_sessions", product.server.rss_mib(), "/proc VmRSS")
