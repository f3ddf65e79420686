"""The event log: publishing, filters, backlog/live switch-over, slow subscribers,
concurrent publishers, transactions and retention, over a real SQLite file."""

from __future__ import annotations

import asyncio
import pathlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.events.log import EVENT_TYPES, EventLog, event_type
from cleveragents.acp.facade.domain.events.subscription import BACKLOG_BATCH, HAND_OUT_BATCH, Subscription
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import events_pb2, plan_pb2
from tests.facade.store.conformance import fails_in_transaction

TIMEOUT = 20.0


@pytest.fixture
def store(db_path: pathlib.Path) -> Iterator[SQLiteStore]:
    store = SQLiteStore(db_path)
    yield store
    store.close()


@pytest.fixture
def log(store: SQLiteStore) -> Iterator[EventLog]:
    log = EventLog(store)
    yield log
    log.close()


def state_changed(plan_id: str, reason: str = "", namespace: str = "default") -> events_pb2.Event:
    return events_pb2.Event(
        namespace=namespace,
        plan_id=plan_id,
        plan_state_changed=events_pb2.PlanStateChanged(
            phase=plan_pb2.PLAN_PHASE_EXECUTE, to_state=plan_pb2.PLAN_STATE_RUNNING, reason=reason
        ),
    )


def tool_invoked(
    plan_id: str, step: str, namespace: str = "default", session_id: str = ""
) -> events_pb2.Event:
    return events_pb2.Event(
        namespace=namespace,
        plan_id=plan_id,
        session_id=session_id,
        tool_invoked=events_pb2.ToolInvoked(step_id=step, tool="file.write"),
    )


async def collect(subscription: Subscription, count: int, *, pause_every: int = 0) -> list[events_pb2.Event]:
    """Read ``count`` events; with ``pause_every``, yield to the loop like a reader that
    writes each event to a socket would."""
    got: list[events_pb2.Event] = []

    async def read() -> None:
        async for event in subscription:
            got.append(event)
            if len(got) == count:
                return
            if pause_every and len(got) % pause_every == 0:
                await asyncio.sleep(0)

    await asyncio.wait_for(read(), TIMEOUT)
    return got


def sequences(events: Sequence[events_pb2.Event]) -> list[int]:
    return [e.sequence for e in events]


# publishing -----------------------------------------------------------------------------


def test_event_types_come_from_the_payload_oneof() -> None:
    fields = events_pb2.Event.DESCRIPTOR.oneofs_by_name["payload"].fields
    assert len(EVENT_TYPES) == len(fields)
    assert {"plan.phase_changed", "tool.invoked", "session.message", "plan.apply_completed"} <= EVENT_TYPES
    assert event_type(tool_invoked("p", "s1")) == "tool.invoked"
    with pytest.raises(ValueError, match="payload"):
        event_type(events_pb2.Event())


def test_publish_fills_type_time_and_sequence(log: EventLog, store: SQLiteStore) -> None:
    given = state_changed("p1", "go")
    given.type = "made.up"
    before = time.time()
    published = log.publish(given)
    assert (published.sequence, published.type) == (1, "plan.state_changed")
    assert before - 1 <= published.time.ToNanoseconds() / 1e9 <= time.time() + 1
    assert given.sequence == 0, "the caller's message is left alone"
    batch = log.publish_many([tool_invoked("p1", "s1"), tool_invoked("p1", "s2")])
    assert sequences(batch) == [2, 3]
    assert log.publish_many([]) == []
    stored = store.read_events(0, 10)
    assert [(e.sequence, e.type, e.plan_id) for e in stored] == [
        (1, "plan.state_changed", "p1"),
        (2, "tool.invoked", "p1"),
        (3, "tool.invoked", "p1"),
    ]


def test_publish_refuses_events_without_namespace_or_payload(log: EventLog, store: SQLiteStore) -> None:
    with pytest.raises(ValueError, match="namespace"):
        log.publish(state_changed("p1", namespace=""))
    with pytest.raises(ValueError, match="payload"):
        log.publish(events_pb2.Event(namespace="default"))
    with pytest.raises(ValueError, match="namespace"):
        log.publish_many([state_changed("p1"), state_changed("p1", namespace="")])
    assert store.last_sequence() == 0


def test_bad_configuration_is_refused(store: SQLiteStore) -> None:
    with pytest.raises(ValueError, match="queue_size"):
        EventLog(store, queue_size=0)
    with pytest.raises(ValueError, match="retention_count"):
        EventLog(store, retention_count=0)
    with pytest.raises(ValueError, match="retention_seconds"):
        EventLog(store, retention_seconds=-1)


# subscribing ----------------------------------------------------------------------------


def test_unknown_event_type_lists_the_valid_ones(log: EventLog) -> None:
    with pytest.raises(ACPError) as info:
        log.subscribe(namespaces=None, event_types=["tool.invoked", "plan.exploded", "bogus"])
    assert info.value.code == "INVALID_PARAMS"
    assert info.value.details["field"] == "event_type"
    assert info.value.details["unknown"] == ["bogus", "plan.exploded"]
    assert info.value.details["valid"] == sorted(EVENT_TYPES)
    assert "plan.phase_changed" in info.value.message
    assert log.subscriber_count == 0


def test_negative_after_sequence_is_refused(log: EventLog) -> None:
    with pytest.raises(ACPError) as info:
        log.subscribe(namespaces=None, after_sequence=-1)
    assert info.value.code == "INVALID_PARAMS"
    assert info.value.details["field"] == "after_sequence"


async def test_filters_by_namespace_plan_session_and_type(log: EventLog) -> None:
    log.publish_many(
        [
            state_changed("p1", namespace="a"),
            tool_invoked("p1", "s1", namespace="a", session_id="sess"),
            tool_invoked("p2", "s1", namespace="b"),
            state_changed("p2", namespace="b"),
        ]
    )

    for filters, expected in [
        ({"namespaces": frozenset({"b"})}, [3, 4]),
        ({"namespaces": None, "plan_id": "p1"}, [1, 2]),
        ({"namespaces": None, "session_id": "sess"}, [2]),
        ({"namespaces": None, "event_types": ["plan.state_changed"]}, [1, 4]),
        ({"namespaces": frozenset({"a"}), "event_types": ["tool.invoked"]}, [2]),
        ({"namespaces": None, "after_sequence": 2}, [3, 4]),
    ]:
        subscription = log.subscribe(**filters)  # type: ignore[arg-type]
        async with subscription:
            got = await collect(subscription, len(expected))
            assert sequences(got) == expected, filters
            # Nothing more is due: the next read waits.
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(anext(subscription), 0.05)
    nothing = log.subscribe(namespaces=frozenset())
    log.publish(state_changed("p3"))
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(anext(nothing), 0.05)
    nothing.close()


@pytest.fixture
def unsynced_log(db_path: pathlib.Path) -> Iterator[EventLog]:
    """A log whose commits skip the fsync: for a test of delivery at volume (tests/facade/store
    has the fsync and crash cases), where 10,000 fsync'd commits on a busy disk took longer
    than the readers' whole timeout."""
    store = SQLiteStore(db_path, synchronous="NORMAL")
    log = EventLog(store)
    yield log
    log.close()
    store.close()


async def test_ten_thousand_events_three_plans_three_filtered_subscribers(unsynced_log: EventLog) -> None:
    """Each subscriber receives exactly its matching events, in sequence order, while the
    producer publishes one event at a time."""
    log = unsynced_log
    total = 10_000
    plans = [("plan-a", "default"), ("plan-b", "default"), ("plan-c", "team")]
    by_plan = log.subscribe(namespaces=None, plan_id="plan-a")
    tools_only = log.subscribe(namespaces=None, event_types=["tool.invoked"])
    team_states = log.subscribe(namespaces=frozenset({"team"}), event_types=["plan.state_changed"])
    published: list[events_pb2.Event] = []

    async def produce() -> None:
        for i in range(total):
            plan_id, namespace = plans[i % 3]
            if i % 2:
                event = tool_invoked(plan_id, f"step-{i}", namespace=namespace)
            else:
                event = state_changed(plan_id, f"r{i}", namespace=namespace)
            published.append(log.publish(event))
            if i % 64 == 0:
                await asyncio.sleep(0)

    expected = {
        "by_plan": [i + 1 for i in range(total) if i % 3 == 0],
        "tools_only": [i + 1 for i in range(total) if i % 2],
        "team_states": [i + 1 for i in range(total) if i % 3 == 2 and i % 2 == 0],
    }
    readers = {
        name: asyncio.create_task(collect(sub, len(expected[name])))
        for name, sub in [("by_plan", by_plan), ("tools_only", tools_only), ("team_states", team_states)]
    }
    await produce()
    assert sequences(published) == list(range(1, total + 1))
    for name, task in readers.items():
        got = await task
        assert sequences(got) == expected[name], name
    # Payloads and causal order within a plan survive the trip.
    team = [e.plan_state_changed.reason for e in readers["team_states"].result()]
    assert team == [f"r{i}" for i in range(total) if i % 3 == 2 and i % 2 == 0]
    for sub in (by_plan, tools_only, team_states):
        sub.close()


async def test_stalled_subscriber_is_ended_and_resumes_without_loss(
    log: EventLog, store: SQLiteStore
) -> None:
    small = EventLog(store, queue_size=64)
    total = 2_000
    fast = [small.subscribe(namespaces=None) for _ in range(2)]
    stalled = small.subscribe(namespaces=None)
    fast_readers = [asyncio.create_task(collect(sub, total)) for sub in fast]
    release = asyncio.Event()
    stalled_got: list[events_pb2.Event] = []

    async def stalled_reader() -> None:
        async for event in stalled:
            stalled_got.append(event)
            if len(stalled_got) == 10:
                await release.wait()

    stalled_task = asyncio.create_task(stalled_reader())
    started = time.perf_counter()
    for i in range(total):
        small.publish(tool_invoked("p", f"s{i}"))
        if i % 16 == 0:
            await asyncio.sleep(0)
    produced_in = time.perf_counter() - started
    # Everyone else got everything while the stalled one was still stalled.
    for reader in fast_readers:
        assert sequences(await asyncio.wait_for(reader, TIMEOUT)) == list(range(1, total + 1))
    assert not release.is_set()
    assert not stalled_task.done()
    assert len(stalled_got) == 10
    assert small.subscriber_count == 2, "the stalled subscriber was detached from the producer"
    assert produced_in < 15

    release.set()
    with pytest.raises(ACPError) as info:
        await asyncio.wait_for(stalled_task, TIMEOUT)
    error = info.value
    assert (error.code, error.details["refinement"]) == ("BUDGET_EXCEEDED", "SUBSCRIBER_TOO_SLOW")
    last = error.details["last_sequence"]
    assert last == stalled_got[-1].sequence
    assert f"after_sequence={last}" in error.message
    # What was queued before the overflow was still delivered, in order, before the error.
    assert sequences(stalled_got) == list(range(1, last + 1))
    assert last >= 10 + 64 - 1

    resumed = small.subscribe(namespaces=None, after_sequence=last)
    rest = await collect(resumed, total - last)
    assert sequences(stalled_got + rest) == list(range(1, total + 1))
    resumed.close()
    for sub in fast:
        sub.close()
    small.close()


@pytest.mark.parametrize("queue_size", [16, 4096])
async def test_switch_over_from_backlog_to_live_has_no_gap_and_no_duplicate(
    db_path: pathlib.Path, queue_size: int
) -> None:
    """Events keep arriving while the subscriber reads its backlog; with a small queue
    the live events overflow during catch-up and are re-read from the store instead.
    Unsynced commits (as ``unsynced_log``): 3,000 fsync'd one-event commits took 17-20 s
    of the reader's 20 s on a loaded machine, and durability is not what this tests."""
    store = SQLiteStore(db_path, synchronous="NORMAL")
    log = EventLog(store, queue_size=queue_size)
    log.publish_many([tool_invoked("p", f"old-{i}") for i in range(3000)])
    subscription = log.subscribe(namespaces=None, after_sequence=1000)

    async def produce() -> None:
        for i in range(3000):
            log.publish(state_changed("p", f"new-{i}"))
            await asyncio.sleep(0)

    producer = asyncio.create_task(produce())
    got = await collect(subscription, 5000, pause_every=5)
    await producer
    assert sequences(got) == list(range(1001, 6001))
    subscription.close()
    log.close()
    store.close()


async def test_live_events_beyond_the_queue_while_the_last_backlog_batch_is_handed_out_are_reread(
    store: SQLiteStore,
) -> None:
    """The last (short) backlog batch switches the subscriber to its live queue, but the
    reader is still handing that batch out: live events overflowing the queue then are
    read again from the store, as during catch-up, instead of ending the subscriber for
    being slow (it was not: it had read nothing live yet)."""
    log = EventLog(store, queue_size=4)
    log.publish_many([state_changed("p", f"old-{i}") for i in range(BACKLOG_BATCH + 44)])
    subscription = log.subscribe(namespaces=None)
    first = await collect(subscription, BACKLOG_BATCH + 1)
    # The short batch is read: the subscriber is attached to the live queue with 43 to hand out.
    log.publish_many([state_changed("p", f"new-{i}") for i in range(10)])
    rest = await collect(subscription, 43 + 10)
    assert sequences(first + rest) == list(range(1, BACKLOG_BATCH + 55))
    # Once everything read is handed out, the live queue takes over again.
    log.publish(state_changed("p", "live"))
    assert sequences(await collect(subscription, 1)) == [BACKLOG_BATCH + 55]
    subscription.close()
    log.close()


async def test_subscribers_reading_the_same_backlog_share_its_events(log: EventLog) -> None:
    log.publish_many([state_changed(f"p{i}", reason=f"r{i}") for i in range(300)])
    alone = await collect(log.subscribe(namespaces=None), 300)
    assert log.subscriber_count == 1
    first, second = log.subscribe(namespaces=None), log.subscribe(namespaces=None)
    one, two = await collect(first, 300), await collect(second, 300)
    assert all(a is b for a, b in zip(one, two, strict=True))
    assert one == alone
    assert [e.plan_state_changed.reason for e in one] == [f"r{i}" for i in range(300)]


async def test_subscribers_catching_up_together_share_each_backlog_read(
    log: EventLog, store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Five subscribers reading a 600-event backlog side by side: one store read per batch
    for all of them (fifteen without sharing), and every one gets every event."""
    log.publish_many([state_changed(f"p{i}") for i in range(600)])
    reads = 0
    read = store.read

    async def counted(fn: Any, **options: Any) -> Any:
        nonlocal reads
        reads += 1
        return await read(fn, **options)

    monkeypatch.setattr(store, "read", counted)
    subscribers = [log.subscribe(namespaces=None) for _ in range(5)]
    got = await asyncio.gather(*(collect(sub, 600) for sub in subscribers))
    assert all(sequences(events) == list(range(1, 601)) for events in got)
    assert reads <= 5
    for sub in subscribers:
        sub.close()


async def test_subscribing_before_iterating_keeps_live_events(log: EventLog) -> None:
    """Attached at subscribe(): what is published before the first read is not lost."""
    log.publish(state_changed("p"))
    subscription = log.subscribe(namespaces=None)
    log.publish_many([state_changed("p"), state_changed("p")])
    assert sequences(await collect(subscription, 3)) == [1, 2, 3]
    log.publish(state_changed("p"))
    assert sequences(await collect(subscription, 1)) == [4]
    subscription.close()


async def test_next_batch_hands_out_what_is_ready_together_in_order(log: EventLog) -> None:
    """A backlog batch comes at most HAND_OUT_BATCH at a time; live events committed
    together come together; the error of a too-slow reader names the last one handed out."""
    total = HAND_OUT_BATCH + 10
    log.publish_many([state_changed("p", reason=f"r{i}") for i in range(total)])
    subscription = log.subscribe(namespaces=None)
    got: list[events_pb2.Event] = []
    async with asyncio.timeout(TIMEOUT):
        while len(got) < total:
            batch = await subscription.next_batch()
            assert 1 <= len(batch) <= HAND_OUT_BATCH
            assert subscription.last_sequence == batch[-1].sequence
            got += batch
        assert sequences(got) == list(range(1, total + 1))
        log.publish_many([state_changed("p"), state_changed("p")])
        assert sequences(await subscription.next_batch()) == [total + 1, total + 2]
    subscription.close()
    with pytest.raises(StopAsyncIteration):
        await subscription.next_batch()


async def test_publishers_on_other_threads(log: EventLog, store: SQLiteStore) -> None:
    """Concurrent publishers: one gap-free sequence, delivered in order, each plan's events
    in the order its producer published them."""
    wide = EventLog(store, queue_size=10_000)
    per_thread = 400
    subscription = wide.subscribe(namespaces=None)
    reader = asyncio.create_task(collect(subscription, 3 * per_thread))

    def produce(plan_id: str) -> None:
        for i in range(per_thread):
            wide.publish(state_changed(plan_id, str(i)))

    threads = [threading.Thread(target=produce, args=(f"plan-{n}",)) for n in range(3)]
    for thread in threads:
        thread.start()

    def join_all() -> None:
        for thread in threads:
            thread.join(TIMEOUT)

    await asyncio.to_thread(join_all)
    got = await reader
    assert sequences(got) == list(range(1, 3 * per_thread + 1))
    for n in range(3):
        reasons = [e.plan_state_changed.reason for e in got if e.plan_id == f"plan-{n}"]
        assert reasons == [str(i) for i in range(per_thread)]
    subscription.close()
    wide.close()


async def test_events_are_delivered_on_commit_only(log: EventLog, store: SQLiteStore) -> None:
    subscription = log.subscribe(namespaces=None)
    next_event = asyncio.create_task(anext(subscription))
    await asyncio.sleep(0.01)
    with store.transaction():
        inside = log.publish(state_changed("p", "in a transaction"))
        # Held across an await only to watch the reader; it does not touch the store.
        await asyncio.sleep(0.05)
        assert not next_event.done()
    delivered = await asyncio.wait_for(next_event, TIMEOUT)
    assert delivered.sequence == inside.sequence == 1

    fails_in_transaction(store, lambda: log.publish(state_changed("p", "rolled back")))
    after = log.publish(state_changed("p", "after"))
    assert after.sequence == 2, "a rolled-back sequence is reused: no gap"
    got = await collect(subscription, 1)
    assert [e.plan_state_changed.reason for e in got] == ["after"]
    subscription.close()


# ending -------------------------------------------------------------------------------------


async def test_close_ends_waiting_readers(store: SQLiteStore) -> None:
    log = EventLog(store)
    subscription = log.subscribe(namespaces=None)
    own = log.subscribe(namespaces=None)
    readers = [asyncio.create_task(collect(s, 1)) for s in (subscription, own)]
    await asyncio.sleep(0.01)
    own.close()
    assert await asyncio.wait_for(readers[1], TIMEOUT) == []
    log.close()
    assert await asyncio.wait_for(readers[0], TIMEOUT) == []
    with pytest.raises(RuntimeError, match="closed"):
        log.publish(state_changed("p"))
    late = log.subscribe(namespaces=None)
    assert [e async for e in late] == []


async def test_async_context_manager_detaches(log: EventLog) -> None:
    async with log.subscribe(namespaces=None) as subscription:
        assert log.subscriber_count == 1
        log.publish(state_changed("p"))
        assert sequences(await collect(subscription, 1)) == [1]
    assert log.subscriber_count == 0
    assert [e async for e in subscription] == []


# retention --------------------------------------------------------------------------------


async def test_retention_by_count(store: SQLiteStore) -> None:
    log = EventLog(store, retention_count=100)
    for i in range(1000):
        log.publish(state_changed("p", str(i)))
    assert store.last_sequence() == 1000
    retained = store.last_sequence() - store.first_sequence() + 1
    assert 100 <= retained <= 110
    subscription = log.subscribe(namespaces=None)
    got = await collect(subscription, retained)
    # The client can tell it missed events: the stream starts above after_sequence + 1.
    assert got[0].sequence == store.first_sequence() > 1
    assert sequences(got) == list(range(got[0].sequence, 1001))
    assert subscription.missed
    subscription.close()
    fresh = log.subscribe(namespaces=None, after_sequence=995)
    assert sequences(await collect(fresh, 5)) == [996, 997, 998, 999, 1000]
    assert not fresh.missed
    fresh.close()
    log.close()


async def test_retention_by_age(store: SQLiteStore) -> None:
    log = EventLog(store, retention_seconds=0.2)
    log.publish_many([state_changed("p") for _ in range(10)])
    await asyncio.sleep(0.3)
    log.publish(state_changed("p"))
    assert (store.first_sequence(), store.last_sequence()) == (11, 11)
    log.publish_many([state_changed("p") for _ in range(5)])
    log.close()
    # Opening a log applies retention at once, even with no new event.
    await asyncio.sleep(0.3)
    EventLog(store, retention_seconds=0.2).close()
    assert (store.first_sequence(), store.last_sequence()) == (16, 16)
