"""The event log: append-only, one global gap-free sequence, in-process publish/subscribe.

Every event is written to the store first; its sequence is the store's and it reaches
live subscribers only once committed, in sequence order (so in causal order within a
plan, whose events are published one after another).

A subscriber attaches to live events *before* it reads the retained backlog, then drops
live events the backlog already gave it (by sequence), so nothing published between the
two is lost. While it is still catching up from the store (until it has handed out the last
batch it read) it cannot fall behind: when its queue overflows the queue is discarded and
it keeps reading the store. Once live, an overflow ends it with BUDGET_EXCEEDED (refinement
SUBSCRIBER_TOO_SLOW) naming the last sequence it got, so it resubscribes with that
``after_sequence`` and misses nothing.
Producers never wait for a subscriber.

Several processes may share one store (``agents serve --workers N``, replicas on one
PostgreSQL, a CLI writing the same SQLite file): the store is the truth for each of them.
With ``follow``, a thread per log (the follower) reads the events committed after the last
sequence this process delivered and hands them to its subscribers, so every subscriber sees
every event of every process, in sequence order, with no gap and no duplicate. It is woken by
the store's ``EventWakeups`` (SQLite: ``PRAGMA data_version``; PostgreSQL: LISTEN/NOTIFY),
only a hint: it also reads every ``poll_interval``, so a lost wake-up costs latency, never an
event. Events this process commits still go out at once from ``after_commit`` when they
follow the last delivered sequence (the single-process fast path); when another process
committed in between, they wait for the follower, which reads them in order with the gap.
Everything is delivered under one lock, at most once per sequence, in increasing order.

Subscribers catching up side by side (a herd reconnecting after a restart, many consoles
opening) share each backlog read: one store query and one decoding per batch for all of them.

Retention (by count and/or age) prunes old events. A subscriber that asks for events
older than what is retained gets what is retained: an unfiltered stream then starts
above ``after_sequence + 1``, and ``Subscription.missed`` is true.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from cleveragents.acp.contract import surface
from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.contract.recent import Recent
from cleveragents.acp.facade.domain.events.subscription import BACKLOG_BATCH, Subscription
from cleveragents.acp.facade.domain.tracing import current_trace_id
from cleveragents.acp.facade.store.base import EventFilter, Store, StoredEvent
from cleveragents.acp.v1 import events_pb2

__all__ = ["EVENT_TYPES", "EventLog", "Subscription", "check_event_types", "event_type"]

# Payload field name -> event type (`plan_phase_changed` -> `plan.phase_changed`), read from
# the descriptor so a new payload in the proto is a new event type with no edit here.
_TYPE_OF_FIELD: Mapping[str, str] = MappingProxyType(
    {
        field.name: field.name.replace("_", ".", 1)
        for field in events_pb2.Event.DESCRIPTOR.oneofs_by_name["payload"].fields
    }
)
EVENT_TYPES: frozenset[str] = frozenset(_TYPE_OF_FIELD.values())

log = logging.getLogger(__name__)

# Decoded backlog events kept (per generation) for the other subscribers reading them.
DECODED_CACHE_SIZE = 2048
# Backlog events kept (per generation) with the response each was decoded in, until the
# events.subscribe handler asks for it (``response_of``): moments later, batch by batch.
CARRIED_CACHE_SIZE = 2048
# Rows the follower reads per query, and how often it reads without a wake-up.
FOLLOW_BATCH = 256
DEFAULT_POLL_INTERVAL = 1.0
# How long close() waits for the follower thread (one wait slice and one read).
_FOLLOWER_JOIN_SECONDS = 5.0


def event_type(event: events_pb2.Event) -> str:
    """The type an event's payload gives it; ValueError when no payload is set."""
    field = event.WhichOneof("payload")
    if field is None:
        raise ValueError("an event needs a payload")
    return _TYPE_OF_FIELD[field]


def check_event_types(event_types: Sequence[str]) -> None:
    """INVALID_PARAMS naming the unknown types, and the valid ones."""
    unknown = sorted(set(event_types) - EVENT_TYPES)
    if unknown:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"unknown event type{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
            f"valid types: {', '.join(sorted(EVENT_TYPES))}",
            {"field": "event_type", "unknown": unknown, "valid": sorted(EVENT_TYPES)},
        )


def _decode(stored: StoredEvent) -> events_pb2.Event:
    event = events_pb2.Event.FromString(stored.body)
    event.sequence = stored.sequence
    return event


class EventLog:
    def __init__(
        self,
        store: Store,
        *,
        queue_size: int = 1024,
        retention_count: int | None = None,
        retention_seconds: float | None = None,
        follow: bool = False,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> None:
        """``follow``: also deliver the events other processes commit to this store (a
        follower thread, woken by ``store.event_wakeups()`` and reading at least every
        ``poll_interval`` seconds)."""
        if queue_size < 1:
            raise ValueError("queue_size must be at least 1")
        if retention_count is not None and retention_count < 1:
            raise ValueError("retention_count must be at least 1")
        if retention_seconds is not None and retention_seconds <= 0:
            raise ValueError("retention_seconds must be positive")
        if poll_interval <= 0:
            raise ValueError("poll_interval must be positive")
        self._store = store
        self.queue_size = queue_size
        self.retention_count = retention_count
        self.retention_seconds = retention_seconds
        # Guards the subscriber set and every subscription's queue. Never held while
        # waiting for the store (fan-out runs under the store's lock, so the reverse
        # order would deadlock).
        self._lock = threading.Lock()
        self._subscribers: set[Subscription] = set()
        self._closed = False
        # Subscribers catching up read the same rows at about the same time: one decoding
        # each, keyed by the row itself (so never stale, whoever else writes the store).
        self._decoded: Recent[tuple[int, bytes], events_pb2.Event] = Recent(DECODED_CACHE_SIZE)
        # Backlog events by identity, with the SubscribeEventsResponse each was parsed in:
        # copying an event into its response cost about as much as parsing it.
        self._carried: Recent[int, tuple[events_pb2.Event, events_pb2.SubscribeEventsResponse]] = Recent(
            CARRIED_CACHE_SIZE
        )
        # Backlog batches being read for several subscribers (``backlog``), by position and filter.
        self._reading: dict[tuple[int, EventFilter], asyncio.Future[tuple[list[events_pb2.Event], int]]] = {}
        # Pruning is amortized: after a tenth of the count limit, or a tenth of the age.
        self._prune_every = max(1, min(1000, (retention_count or 0) // 10))
        self._prune_interval = min(60.0, (retention_seconds or 0.0) / 10)
        self._since_prune = 0
        self._last_prune = time.monotonic()
        self.prune()
        # The newest sequence handed to subscribers (or skipped while there were none):
        # delivery is in increasing order from here, under the lock.
        self._delivered = store.last_sequence()
        self.poll_interval = poll_interval
        self._follower: threading.Thread | None = None
        self._wakeups = store.event_wakeups() if follow else None
        if follow:
            self._follower = threading.Thread(target=self._follow, name="acp-event-follower", daemon=True)
            self._follower.start()

    @property
    def store(self) -> Store:
        return self._store

    # publishing -----------------------------------------------------------------------

    def publish(self, event: events_pb2.Event) -> events_pb2.Event:
        """Append one event; returns a copy with type, time and sequence filled in.

        Inside an open store transaction the event is committed (and delivered) with it."""
        return self.publish_many([event])[0]

    async def append(self, events: Sequence[events_pb2.Event]) -> list[events_pb2.Event]:
        """``publish_many`` on the store's writer thread: the loop does not wait for the
        commit, and the events are delivered (in sequence order) once it is durable."""
        return await self._store.write(lambda _store: self.publish_many(events))

    def publish_many(self, events: Sequence[events_pb2.Event]) -> list[events_pb2.Event]:
        """Append events in one transaction, with consecutive sequences."""
        if self._closed:
            raise RuntimeError("the event log is closed")
        if not events:
            return []
        prepared: list[events_pb2.Event] = []
        stored: list[StoredEvent] = []
        now_ns = time.time_ns()
        trace_id = current_trace_id()
        for given in events:
            if not given.namespace:
                raise ValueError("an event needs a namespace")
            event = events_pb2.Event()
            event.CopyFrom(given)
            event.type = event_type(given)
            event.sequence = 0
            event.time.FromNanoseconds(now_ns)
            if not event.trace_id and trace_id:
                event.trace_id = trace_id
            prepared.append(event)
            stored.append(
                StoredEvent(
                    sequence=0,
                    namespace=event.namespace,
                    type=event.type,
                    plan_id=event.plan_id,
                    session_id=event.session_id,
                    time=now_ns / 1e9,
                    body=event.SerializeToString(),
                )
            )
        with self._store.transaction():
            sequences = self._store.append_events(stored)
            for event, sequence in zip(prepared, sequences, strict=True):
                event.sequence = sequence
            delivered = [_copy(event) for event in prepared]
            self._store.after_commit(lambda: self._fan_out(delivered))
        self._since_prune += len(prepared)
        self._maybe_prune()
        return prepared

    def _fan_out(self, events: list[events_pb2.Event]) -> None:
        """Runs after the commit, in commit (so sequence) order; only fills queues. Events
        another process committed just before these are the follower's to read first
        (with these); without a follower they are not delivered here at all."""
        with self._lock:
            if self._follower is not None and events[0].sequence > self._delivered + 1:
                return
            self._deliver(events)

    def _deliver(self, events: Sequence[events_pb2.Event]) -> None:
        """Offer the events above the last delivered sequence (called with the lock held;
        ``events`` ascending and contiguous, as the store gives them)."""
        delivered = self._delivered
        if events[-1].sequence <= delivered:
            return
        self._delivered = events[-1].sequence
        if not self._subscribers:
            return
        subscribers = list(self._subscribers)
        for event in events:
            if event.sequence <= delivered:
                continue
            for subscriber in subscribers:
                if not subscriber.offer(event):
                    self._subscribers.discard(subscriber)

    # following other processes ----------------------------------------------------------

    def _follow(self) -> None:
        """The follower thread: wait for a wake-up (or the poll interval), then deliver
        what the store holds after the last delivered sequence."""
        wakeups = self._wakeups
        assert wakeups is not None
        down = False
        try:
            while not self._closed:
                wakeups.wait(self.poll_interval)
                if self._closed:
                    return
                try:
                    self._follow_once()
                except Exception as exc:
                    # A store error (a locked or vanished file, a database restarting): the
                    # next wake-up or poll reads again from the same sequence, so nothing is
                    # skipped. An outage is one line when it starts, not a traceback a poll.
                    outage = self._store.outage(exc)
                    if outage is None:
                        log.exception("the event follower could not read the store")
                    elif not down:
                        log.warning(
                            "the event follower cannot reach the store (%s); retrying every %g s",
                            outage,
                            self.poll_interval,
                        )
                    down = outage is not None
                else:
                    if down:
                        log.warning("the event follower reaches the store again")
                    down = False
        finally:
            wakeups.close()

    def _follow_once(self) -> None:
        while not self._closed:
            after = self._delivered
            if not self._subscribers:
                # Nobody to deliver to: move past the head without decoding. A subscriber
                # that attaches after the check below reads everything up to ``head`` as
                # its backlog (committed before it attached).
                head = self._store.last_sequence()
                with self._lock:
                    if not self._subscribers:
                        self._delivered = max(self._delivered, head)
                        return
            batch = self._store.read_events(after, FOLLOW_BATCH)
            if not batch:
                return
            events = [_decode(stored) for stored in batch]
            with self._lock:
                self._deliver(events)
            if len(batch) < FOLLOW_BATCH:
                return

    @property
    def delivered_sequence(self) -> int:
        """The newest sequence this process has handed to its subscribers."""
        return self._delivered

    @property
    def fanning_out(self) -> bool:
        """More than one subscriber is attached, so work per event may be worth sharing
        (a hint: read without the lock)."""
        return len(self._subscribers) > 1

    async def backlog(
        self, after: int, where: EventFilter, shared: bool
    ) -> tuple[list[events_pb2.Event], int]:
        """One backlog batch after ``after`` and the log's first sequence, read off the loop
        in one snapshot. ``shared`` (others are attached): subscribers asking for the same
        batch while it is being read (a herd reconnecting, many consoles opening) wait for
        that one read instead of each querying the store."""
        if not shared:
            return await self._read_backlog(after, where, False)
        key = (after, where)
        loop = asyncio.get_running_loop()
        reading = self._reading.get(key)
        if reading is not None and reading.get_loop() is loop:
            try:
                # Shielded: a waiter that leaves does not cancel the read for the others.
                return await asyncio.shield(reading)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not reading.cancelled() or (task is not None and task.cancelling()):
                    raise
                # The reader left before its read was done: read on our own.
        reading = loop.create_future()
        self._reading[key] = reading
        try:
            found = await self._read_backlog(after, where, True)
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                reading.cancel()
            else:
                reading.set_exception(exc)
                # Retrieved here: when nobody waited, that is not worth a warning.
                reading.exception()
            raise
        else:
            reading.set_result(found)
        finally:
            if self._reading.get(key) is reading:
                del self._reading[key]
        return found

    async def _read_backlog(
        self, after: int, where: EventFilter, shared: bool
    ) -> tuple[list[events_pb2.Event], int]:
        # Urgent: a catch-up races the live queue, which a busy loop fills while a held read waits.
        batch, first = await self._store.read(
            lambda store: (store.read_event_bodies(after, BACKLOG_BATCH, where), store.first_sequence()),
            urgent=True,
        )
        return [self._event_of(row, shared) for row in batch], first

    def _event_of(self, row: tuple[int, bytes], shared: bool) -> events_pb2.Event:
        """``row``: a sequence and its body. ``shared``: other subscribers were attached
        when the batch was asked for."""
        if not shared:
            # Keeping events for nobody else costs more than decoding them.
            return self._carry(row)
        event = self._decoded.get(row)
        if event is None:
            event = self._carry(row)
            self._decoded.put(row, event)
        return event

    def _carry(self, row: tuple[int, bytes]) -> events_pb2.Event:
        """The event of a backlog row, parsed inside the response events.subscribe sends
        it in (kept for ``response_of``; on the event loop)."""
        response = events_pb2.SubscribeEventsResponse()
        event = response.event
        event.MergeFromString(row[1])
        event.sequence = row[0]
        self._carried.put(id(event), (event, response))
        return event

    def response_of(self, event: events_pb2.Event) -> events_pb2.SubscribeEventsResponse | None:
        """The response a backlog event was decoded in, while it is kept (None: wrap it).
        Shared like the event: read it, do not modify it."""
        found = self._carried.get(id(event))
        # By identity: the entry holds the event, so its id cannot name another object.
        return found[1] if found is not None and found[0] is event else None

    # retention ------------------------------------------------------------------------

    def _maybe_prune(self) -> None:
        due_by_count = self.retention_count is not None and self._since_prune >= self._prune_every
        due_by_age = (
            self.retention_seconds is not None and time.monotonic() - self._last_prune >= self._prune_interval
        )
        if due_by_count or due_by_age:
            self.prune()

    def prune(self) -> int:
        """Apply retention now; returns how many events were dropped."""
        self._since_prune = 0
        self._last_prune = time.monotonic()
        if self.retention_count is None and self.retention_seconds is None:
            return 0
        older_than = time.time() - self.retention_seconds if self.retention_seconds is not None else None
        return self._store.prune_events(keep_last=self.retention_count, older_than=older_than)

    # subscribing ----------------------------------------------------------------------

    def subscribe(
        self,
        *,
        namespaces: frozenset[str] | None,
        plan_id: str = "",
        session_id: str = "",
        event_types: Sequence[str] = (),
        after_sequence: int = 0,
    ) -> Subscription:
        """Attach now; the backlog after ``after_sequence`` is read as the caller iterates.

        ``namespaces`` None means every namespace (local mode)."""
        check_event_types(event_types)
        if after_sequence < 0:
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                "after_sequence must not be negative",
                {"field": "after_sequence"},
            )
        where = EventFilter(
            namespaces=namespaces,
            plan_id=plan_id,
            session_id=session_id,
            types=frozenset(event_types),
        )
        subscription = Subscription(self, where, after_sequence, self._lock)
        with self._lock:
            if self._closed:
                subscription.end()
            else:
                self._subscribers.add(subscription)
        return subscription

    def subscription(self, ctx: CallContext, request: events_pb2.SubscribeEventsRequest) -> Subscription:
        """``events.subscribe`` for a call: events of the namespaces the caller may see (or
        the one it names, once authorized), attached now so a bad filter or a forbidden
        namespace fails before any stream headers go out."""
        return self.subscribe(
            namespaces=ctx.visible_namespaces(request.namespace),
            plan_id=request.plan_id,
            session_id=request.session_id,
            event_types=surface.event_types(ctx.served_version, request.event_type),
            after_sequence=request.after_sequence,
        )

    def detach(self, subscription: Subscription) -> None:
        """Stop offering events to ``subscription`` (``Subscription.close``)."""
        with self._lock:
            self._subscribers.discard(subscription)

    @property
    def subscriber_count(self) -> int:
        with self._lock:
            return len(self._subscribers)

    def close(self) -> None:
        """End every subscription (its reader stops iterating), refuse new events and stop
        the follower (blocks for its current read: call it off the loop)."""
        with self._lock:
            self._closed = True
            subscribers = list(self._subscribers)
            self._subscribers.clear()
            for subscriber in subscribers:
                subscriber.end()
        if self._wakeups is not None:
            self._wakeups.close()
        follower = self._follower
        if follower is not None and follower is not threading.current_thread():
            follower.join(_FOLLOWER_JOIN_SECONDS)


def _copy(event: events_pb2.Event) -> events_pb2.Event:
    copied = events_pb2.Event()
    copied.CopyFrom(event)
    return copied
