"""In-process figures: the local client against a direct facade call, event latency, plan flow.

- ``local_client_overhead_us``: the in-process client's own cost per call: µs per
  ``session.show`` through ``ACPClient(LocalTransport)`` (keyword params, as a caller writes
  it) minus µs per the same call made directly (``ServiceFacade.invoke`` with a ready request).
- ``local_call_ratio``: the same two times divided; reported beside it, no longer judged (a
  faster facade raises the ratio while the client's cost stays put).
- ``event_latency_p99_ms``: ``EventLog.publish`` -> receipt by a subscriber reading
  ``events.subscribe`` through the local transport, one event per millisecond.
- ``plan_flow_per_s``: complete scripted plans (use, execute, apply of three files).
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

from bench import plans
from bench.load import percentile
from bench.run import Run
from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.transport import CallOptions
from cleveragents.acp.facade.factory import open_event_log, open_facade
from cleveragents.acp.facade.handlers import table
from cleveragents.acp.facade.handlers.events import EventHandlers
from cleveragents.acp.facade.handlers.meta import MetaHandlers
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import events_pb2, session_pb2

BATCH = 200


async def _per_call_us(
    candidates: dict[str, Callable[[], Awaitable[object]]], seconds: float
) -> dict[str, float]:
    """Median time per call of each candidate, in interleaved batches (so drift in the
    machine's speed hits all of them alike)."""
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for call in candidates.values():
        for _ in range(BATCH // 4):
            await call()
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or not all(len(s) >= 3 for s in samples.values()):
        for name, call in candidates.items():
            started = time.perf_counter()
            for _ in range(BATCH):
                await call()
            samples[name].append((time.perf_counter() - started) / BATCH * 1e6)
    return {name: statistics.median(values) for name, values in samples.items()}


async def local_call_ratio(run: Run) -> None:
    facade = open_facade(run.scratch("local") / "acp.db")
    client = ACPClient(LocalTransport(facade))
    try:
        created = await client.call("session.create", title="bench")
        assert isinstance(created, session_pb2.CreateSessionResponse)
        session_id = created.session.meta.id
        op = catalog.OPERATIONS["session.show"]
        request = session_pb2.GetSessionRequest(session_id=session_id)

        async def direct() -> object:
            return await facade.invoke(op, request, CallContext(request_id="bench"))

        async def through_client() -> object:
            return await client.call("session.show", session_id=session_id)

        times = await _per_call_us({"direct": direct, "client": through_client}, run.mode.local_seconds)
    finally:
        await client.close()
        await facade.close()
    run.note("local_direct_us", times["direct"])
    run.note("local_client_us", times["client"])
    run.record("local_call_ratio", times["client"] / times["direct"], "in-process")
    run.record("local_client_overhead_us", times["client"] - times["direct"], "in-process")


def _event(index: int) -> events_pb2.Event:
    return events_pb2.Event(
        namespace="default",
        session_id="bench-session",
        session_message=events_pb2.SessionMessage(
            message=session_pb2.Message(
                id=f"m{index}", index=index, role=session_pb2.MESSAGE_ROLE_USER, content="hello"
            )
        ),
    )


async def event_latency(run: Run) -> None:
    store = SQLiteStore(run.scratch("latency") / "acp.db")
    log = open_event_log(store)
    served = ["meta.version", "events.subscribe", "events.ticket"]
    handlers = table.build([MetaHandlers(), EventHandlers(log)], serves=served)
    transport = LocalTransport(ServiceFacade(handlers))
    wanted = run.mode.latency_events
    received: dict[int, float] = {}
    sent: dict[int, float] = {}
    all_in = asyncio.Event()

    op = catalog.OPERATIONS["events.subscribe"]
    # Admitted, so attached to the log, once open_stream returns.
    items = await transport.open_stream(op, op.request_type(), CallOptions(None, None, "bench"))

    async def subscriber() -> None:
        async for item in items:
            assert isinstance(item, events_pb2.SubscribeEventsResponse)
            received[item.event.sequence] = time.perf_counter()
            if len(received) >= wanted:
                all_in.set()
                return

    reader = asyncio.create_task(subscriber())
    try:
        async with asyncio.timeout(run.mode.stream_timeout):
            for index in range(wanted):
                started = time.perf_counter()
                sent[log.publish(_event(index)).sequence] = started
                await asyncio.sleep(0.001)
            await all_in.wait()
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        log.close()
        store.close()
    latencies = [(received[seq] - at) * 1000 for seq, at in sent.items() if seq in received]
    run.note("event_latency_p50_ms", percentile(latencies, 50))
    run.record("event_latency_p99_ms", percentile(latencies, 99), "in-process")


async def plan_flow(run: Run) -> None:
    facade = open_facade(run.scratch("plans") / "acp.db")
    client = ACPClient(LocalTransport(facade))
    try:
        await plans.set_up(client, run.scratch("plans/project"))
        await plans.flow(client, "warm-up")
        count = 0
        started = time.perf_counter()
        deadline = started + run.mode.local_seconds
        while count == 0 or time.perf_counter() < deadline:
            await plans.flow(client, f"p{count}")
            count += 1
        elapsed = time.perf_counter() - started
    finally:
        await client.close()
        await facade.close()
    run.note("plan_flow_ms", elapsed / count * 1000)
    run.record("plan_flow_per_s", count / elapsed, "in-process")


async def run_all(run: Run) -> None:
    await local_call_ratio(run)
    await event_latency(run)
    await plan_flow(run)
