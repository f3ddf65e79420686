"""The event follower: two stores on one SQLite file stand for two processes (each has its own
connections and writer thread, as a worker does); every subscriber of either gets every event
either commits, in sequence order, once. The real-process version is in
tests/gateway/test_workers.py."""

from __future__ import annotations

import asyncio
import logging
import pathlib
import threading
import time
from collections.abc import Iterator

import pytest

from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.events.log import EventLog
from cleveragents.acp.facade.domain.events.subscription import Subscription
from cleveragents.acp.facade.store.base import EventWakeups, StoreUnavailableError
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.facade.store.wakeups import DataVersionWakeups, PeerChannel
from cleveragents.acp.v1 import events_pb2
from tests.facade.domain.test_events import collect, sequences, state_changed, tool_invoked

TIMEOUT = 20.0


@pytest.fixture
def stores(db_path: pathlib.Path) -> Iterator[tuple[SQLiteStore, SQLiteStore]]:
    first, second = SQLiteStore(db_path), SQLiteStore(db_path)
    yield first, second
    first.close()
    second.close()


@pytest.fixture
def logs(stores: tuple[SQLiteStore, SQLiteStore]) -> Iterator[tuple[EventLog, EventLog]]:
    first, second = (EventLog(store, follow=True, poll_interval=0.5) for store in stores)
    yield first, second
    first.close()
    second.close()


def test_data_version_wakes_on_another_connections_commit(db_path: pathlib.Path) -> None:
    store = SQLiteStore(db_path)
    wakeups = DataVersionWakeups(db_path, 0.001)
    try:
        assert wakeups.wait(0.05) is False  # nothing committed: the timeout
        store.append_events([])  # an empty transaction commits nothing
        assert wakeups.wait(0.05) is False
        log = EventLog(store)
        log.publish(state_changed("p1"))
        assert wakeups.wait(TIMEOUT) is True
        assert wakeups.wait(0.05) is False  # seen once
        log.close()
    finally:
        wakeups.close()
        store.close()
    assert wakeups.wait(1.0) is False  # closed: returns at once, touches no connection


def test_a_peer_announcement_wakes_at_once(tmp_path: pathlib.Path, db_path: pathlib.Path) -> None:
    """With a tick far longer than the test's bound, only the peer's datagram can wake the
    wait early; the announcing side never blocks, even with nobody listening."""
    SQLiteStore(db_path).close()
    mine = PeerChannel(tmp_path, "w0", ["w0", "w1"])
    theirs = PeerChannel(tmp_path, "w1", ["w0", "w1"])
    theirs.announce()  # w0 not bound yet: skipped
    wakeups = DataVersionWakeups(db_path, 30.0, mine.listen())
    try:
        assert wakeups.wait(0.05) is False
        for _ in range(5000):  # more than the socket buffers: the rest are dropped
            theirs.announce()
        started = time.monotonic()
        assert wakeups.wait(30.0) is True
        assert time.monotonic() - started < 10  # the datagram, not the 30 s tick
        assert wakeups.wait(0.05) is False  # one wake-up for the whole burst
    finally:
        wakeups.close()
        mine.close()
        theirs.close()
    assert not (tmp_path / "w0").exists()


async def test_every_subscriber_gets_both_processes_events_in_order(logs: tuple[EventLog, EventLog]) -> None:
    first, second = logs
    subscribers = [first.subscribe(namespaces=None), second.subscribe(namespaces=None)]
    per_writer = 150

    async def write(log: EventLog, name: str) -> None:
        for index in range(per_writer):
            await log.append([tool_invoked(name, f"{name}-{index}")])

    readers = [asyncio.create_task(collect(sub, 2 * per_writer)) for sub in subscribers]
    await asyncio.wait_for(asyncio.gather(write(first, "a"), write(second, "b")), TIMEOUT)
    got = await asyncio.gather(*readers)
    for events in got:
        assert sequences(events) == list(range(1, 2 * per_writer + 1))
        # Each writer's events in its own order, whoever delivered them.
        for name in ("a", "b"):
            steps = [e.tool_invoked.step_id for e in events if e.plan_id == name]
            assert steps == [f"{name}-{index}" for index in range(per_writer)]
    for subscriber in subscribers:
        subscriber.close()


async def test_local_events_after_a_foreign_one_wait_for_it(logs: tuple[EventLog, EventLog]) -> None:
    """A commits 1, B commits 2, A commits 3: A's subscriber gets 1, 2, 3 (3's fast path
    must not overtake 2, which only the follower brings)."""
    first, second = logs
    subscriber = first.subscribe(namespaces=None)
    reader = asyncio.create_task(collect(subscriber, 3))
    await first.append([state_changed("a", "1")])
    await second.append([state_changed("b", "2")])
    await first.append([state_changed("a", "3")])
    events = await reader
    assert sequences(events) == [1, 2, 3]
    assert [e.plan_state_changed.reason for e in events] == ["1", "2", "3"]
    subscriber.close()


async def test_resume_on_the_other_process(logs: tuple[EventLog, EventLog]) -> None:
    first, second = logs
    await first.append([state_changed("p", str(index)) for index in range(10)])
    resumed = second.subscribe(namespaces=None, after_sequence=4)
    reader = asyncio.create_task(collect(resumed, 10))
    await first.append([state_changed("p", str(index)) for index in range(10, 14)])
    events = await reader
    assert sequences(events) == list(range(5, 15))
    resumed.close()


async def test_a_lost_wakeup_costs_latency_not_events(
    stores: tuple[SQLiteStore, SQLiteStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No wake-up ever comes (the base EventWakeups only sleeps): the poll delivers all."""
    first, second = stores
    monkeypatch.setattr(second, "event_wakeups", EventWakeups)
    writer = EventLog(first)
    deaf = EventLog(second, follow=True, poll_interval=0.05)
    try:
        subscriber = deaf.subscribe(namespaces=None)
        reader = asyncio.create_task(collect(subscriber, 40))
        for index in range(40):
            await writer.append([state_changed("p", str(index))])
        assert sequences(await reader) == list(range(1, 41))
        subscriber.close()
    finally:
        deaf.close()
        writer.close()


async def test_follower_skips_ahead_while_nobody_listens(logs: tuple[EventLog, EventLog]) -> None:
    first, second = logs
    await first.append([state_changed("p", str(index)) for index in range(300)])
    for _ in range(int(TIMEOUT / 0.01)):
        if second.delivered_sequence == 300:
            break
        await asyncio.sleep(0.01)
    assert second.delivered_sequence == 300
    live = second.subscribe(namespaces=None, after_sequence=300)
    reader = asyncio.create_task(collect(live, 1))
    await first.append([state_changed("p", "new")])
    assert sequences(await reader) == [301]
    live.close()


async def test_a_slow_subscriber_of_foreign_events_is_ended_with_where_to_resume(
    stores: tuple[SQLiteStore, SQLiteStore],
) -> None:
    first, second = stores
    writer = EventLog(first)
    small = EventLog(second, follow=True, queue_size=8)
    try:
        subscriber = small.subscribe(namespaces=None)
        # Live (an empty backlog) before the burst.
        assert await _first_or_none(subscriber) is None
        await writer.append([state_changed("p", str(index)) for index in range(50)])
        got: list[events_pb2.Event] = []

        async def read_all() -> None:
            async for event in subscriber:
                got.append(event)

        with pytest.raises(ACPError) as raised:
            await asyncio.wait_for(read_all(), TIMEOUT)
        assert raised.value.details["refinement"] == "SUBSCRIBER_TOO_SLOW"
        assert raised.value.details["last_sequence"] == got[-1].sequence == len(got)
        resumed = small.subscribe(namespaces=None, after_sequence=len(got))
        rest = await collect(resumed, 50 - len(got))
        assert sequences(got + rest) == list(range(1, 51))
        resumed.close()
    finally:
        small.close()
        writer.close()


async def _first_or_none(subscription: Subscription) -> events_pb2.Event | None:
    """None when nothing arrives within a moment (the subscriber is live and idle)."""
    try:
        return await asyncio.wait_for(subscription.__anext__(), 0.1)
    except TimeoutError:
        return None


def test_close_stops_the_follower_thread(stores: tuple[SQLiteStore, SQLiteStore]) -> None:
    log = EventLog(stores[0], follow=True)
    follower = log._follower
    assert follower is not None
    assert follower.is_alive()
    log.close()
    assert not follower.is_alive()


async def test_a_store_outage_is_one_line_not_a_traceback_a_poll(
    stores: tuple[SQLiteStore, SQLiteStore], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A database restarting fails every poll until it is back: the follower said so with a
    40-line traceback each time; now one line when it starts and one when it ends (issue 29)."""
    first, second = stores
    failures = 5
    failed = threading.Event()
    real = second.last_sequence

    def restarting() -> int:
        nonlocal failures
        if failures:
            failures -= 1
            if not failures:
                failed.set()
            raise StoreUnavailableError(
                "cannot connect to postgresql://db/acp: the database system is starting up"
            )
        return real()

    writer = EventLog(first)
    with caplog.at_level(logging.WARNING, logger="cleveragents.acp.facade.domain.events"):
        follower = EventLog(second, follow=True, poll_interval=0.01)
        monkeypatch.setattr(second, "last_sequence", restarting)
        try:
            await asyncio.to_thread(failed.wait, TIMEOUT)
            await writer.append([state_changed("p")])
            for _ in range(int(TIMEOUT / 0.01)):
                if follower.delivered_sequence == 1:
                    break
                await asyncio.sleep(0.01)
            assert follower.delivered_sequence == 1
        finally:
            follower.close()
            writer.close()
    said = [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records]
    assert said == [
        (
            "WARNING",
            "the event follower cannot reach the store (cannot connect to postgresql://db/acp: the database "
            "system is starting up); retrying every 0.01 s",
            None,
        ),
        ("WARNING", "the event follower reaches the store again", None),
    ]
