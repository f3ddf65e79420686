"""The deliverer: each enabled subscription delivered by exactly one process at a time.

Every server process (each of ``--workers``, each replica on PostgreSQL) runs one. It scans
for enabled subscriptions and claims the lease ``webhook:<id>`` of each one nobody holds (or
whose holder stopped renewing, or is a process of this kernel that no longer exists: the
plan leases' rules, ``plans/leases.py``). The holder runs one task per subscription that
reads the event log from the stored cursor (``EventLog.subscribe``: the backlog, then live
events, in sequence order) and POSTs each event that passes the filter, one at a time,
until the receiver accepts it (2xx), retrying on the schedule of ``settings.py``.

Fencing: the holder sends only while its lease is surely live by its own clock (renewed
less than 90% of the lease ago, counted from before the renewal was sent), and every write
it makes (the cursor, counters, the history) checks the lease's token in the write's
transaction, so a process that lost its lease stops within one request and records
nothing. What was sent but not yet recorded is sent again by the next holder, with the same
``webhook-id``: delivery is at least once, and receivers drop duplicates by that id.

Bookkeeping is written behind the deliveries (one write for all the attempts made while the
previous one committed), so a delivery waits for the receiver, never for the disk.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from cleveragents.acp.contract import codec
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.access.webhook_egress import WebhookEgress
from cleveragents.acp.facade.domain.events.log import EventLog
from cleveragents.acp.facade.domain.events.subscription import Subscription
from cleveragents.acp.facade.domain.plans import leases as plan_leases
from cleveragents.acp.facade.domain.plans.leasing import every
from cleveragents.acp.facade.domain.webhooks import records, sender, signing
from cleveragents.acp.facade.domain.webhooks.attempts import RESULT_NAMES, delivery
from cleveragents.acp.facade.domain.webhooks.records import (
    KIND,
    SECRET_KIND,
    STATE_KIND,
    Secrets,
    State,
    put,
    put_state,
)
from cleveragents.acp.facade.domain.webhooks.service import Poke
from cleveragents.acp.facade.domain.webhooks.settings import DeliverySettings
from cleveragents.acp.facade.store.base import Lease, LeaseLostError, ListQuery, Record, Store
from cleveragents.acp.v1 import events_pb2, webhook_pb2

log = logging.getLogger(__name__)

PREFIX = "webhook:"
# The most subscriptions one scan claims; the rest wait for the next scan.
SCAN_LIMIT = 500
# Attempts recorded behind the deliveries before a delivery waits for them to be written.
MAX_UNWRITTEN = 256
# A lease is trusted for this share of its length after the renewal that extended it began.
TRUSTED_SHARE = 0.9


def lease_name(webhook_id: str) -> str:
    return PREFIX + webhook_id


def message_id(sequence: int) -> str:
    """A delivery's ``webhook-id``: the event's, the same for every attempt and every process."""
    return f"evt_{sequence}"


def body_of(event: events_pb2.Event) -> bytes:
    """What is POSTed: the event as ``events.subscribe`` gives it, under ``data``."""
    document = {"type": event.type, "timestamp": event.time.ToJsonString(), "data": codec.to_dict(event)}
    return json.dumps(document, separators=(",", ":")).encode()


@dataclass
class Stats:
    """What the server's metrics read (``acp_webhook_*``): this process's deliveries."""

    results: Counter[str] = field(default_factory=Counter)
    # (namespace, name) -> events after its cursor, for the subscriptions run here.
    backlog: dict[tuple[str, str], int] = field(default_factory=dict)


class _RestartError(Exception):
    """The subscription changed (or its queue overflowed): read it again and go on."""


class _StopError(Exception):
    """The subscription is gone, disabled or no longer ours: the runner ends."""


class Deliverer(Poke):
    def __init__(
        self,
        store: Store,
        events: EventLog,
        egress: WebhookEgress,
        settings: DeliverySettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.events = events
        self.egress = egress
        self.settings = settings or DeliverySettings.from_env()
        self.owner = plan_leases.new_owner()
        plan_leases.opened(self.owner)
        self.stats = Stats()
        self.latency_observer: Callable[[float], None] | None = None
        self.clock = clock
        # webhook id -> its runner (while this process holds its lease).
        self._runners: dict[str, _Runner] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._scan_wake = asyncio.Event()
        self._closed = False

    # the service's pokes -----------------------------------------------------------------

    def changed(self, webhook_id: str) -> None:
        runner = self._runners.get(webhook_id)
        if runner is not None:
            runner.poke()
        self._scan_wake.set()

    @property
    def limits(self) -> sender.Limits:  # type: ignore[override]
        return self.settings.limits

    def tested(self, done: webhook_pb2.WebhookDelivery) -> None:
        self.stats.results[RESULT_NAMES[done.result]] += 1

    # running -------------------------------------------------------------------------------

    def start(self) -> None:
        """On the serving loop: scan now and every ``scan_seconds``; renew every third of a lease."""
        if self._tasks:
            return
        loop = asyncio.get_running_loop()
        self._tasks.add(loop.create_task(self._scanning(), name="webhook-scan"))
        self._tasks.add(
            loop.create_task(
                every(self.store, self.settings.lease_seconds / 3, self._heartbeat, first_wait=True),
                name="webhook-lease-heartbeat",
            )
        )

    async def _scanning(self) -> None:
        while not self._closed:
            try:
                await self._scan()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                outage = self.store.outage(exc)
                if outage is not None:
                    log.warning("webhooks: the scan cannot reach the store (%s)", outage)
                else:
                    log.exception("webhooks: the scan failed; trying again")
            self._scan_wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.scan_seconds):
                    await self._scan_wake.wait()

    async def _scan(self) -> None:
        """Claim the enabled subscriptions nobody delivers (or a dead process held), and
        wake the runners of those another process changed (epoch), disabled or removed:
        one read a scan for all of them."""
        found = await self.store.read(_claimable)
        seen = set()
        for record, lease, epoch in found:
            seen.add(record.id)
            runner = self._runners.get(record.id)
            if runner is not None:
                if epoch != runner.epoch:
                    runner.poke()
                continue
            if self._closed:
                return
            held = lease is not None and bool(lease.owner) and lease.live
            if (
                held
                and lease is not None
                and lease.owner != self.owner
                and not plan_leases.holder_gone(lease.owner)
            ):
                continue
            steal = lease.token if lease is not None and lease.owner and lease.live else None
            began = self.clock()
            claimed = await self.store.write(
                functools.partial(self._claim, webhook_id=record.id, steal=steal)
            )
            if claimed is None or self._closed:
                continue
            runner = _Runner(self, record.id, claimed.token, began)
            self._runners[record.id] = runner
            runner.task = asyncio.get_running_loop().create_task(runner.run(), name=f"webhook-{record.id}")
        if len(found) < SCAN_LIMIT:
            for webhook_id, runner in list(self._runners.items()):
                if webhook_id not in seen:
                    runner.poke()

    def _claim(self, store: Store, *, webhook_id: str, steal: int | None) -> Lease | None:
        return store.claim_lease(
            lease_name(webhook_id), self.owner, self.settings.lease_seconds, steal_token=steal
        )

    async def _heartbeat(self) -> None:
        if not self._runners:
            return
        tokens = {lease_name(i): r.token for i, r in self._runners.items()}
        began = self.clock()
        kept = await self.store.write(
            lambda store: store.renew_leases(self.owner, tokens, self.settings.lease_seconds)
        )
        for webhook_id, runner in list(self._runners.items()):
            if lease_name(webhook_id) in kept:
                runner.trusted_until = began + self.settings.lease_seconds * TRUSTED_SHARE
            else:
                log.warning("webhook %s: this process lost its lease; another delivers it now", webhook_id)
                runner.lost()

    def ended(self, runner: _Runner) -> None:
        if self._runners.get(runner.webhook_id) is runner:
            del self._runners[runner.webhook_id]
            self.stats.backlog.pop(runner.label, None)
        self._scan_wake.set()

    async def close(self) -> None:
        self._closed = True
        plan_leases.closed(self.owner)
        runners = list(self._runners.values())
        for task in list(self._tasks) + [r.task for r in runners if r.task is not None]:
            task.cancel()
        for task in list(self._tasks) + [r.task for r in runners if r.task is not None]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        held = {lease_name(r.webhook_id): r.token for r in runners}
        if held:
            with contextlib.suppress(Exception):
                await self.store.write(lambda store: [store.release_lease(n, t) for n, t in held.items()])


def _claimable(store: Store) -> list[tuple[Record, Lease | None, int]]:
    """The enabled subscriptions, each with its lease and its state's epoch."""
    found = store.query(ListQuery(KIND, state="enabled", limit=SCAN_LIMIT))
    return [
        (record, store.get_lease(lease_name(record.id)), State.of(store.get(STATE_KIND, record.id)).epoch)
        for record in found
    ]


@dataclass
class _Attempt:
    done: webhook_pb2.WebhookDelivery
    # The cursor once it is recorded (its event delivered), else None.
    cursor: int | None = None


class _Runner:
    """One subscription's deliveries, in this process, while it holds the lease."""

    def __init__(self, owner: Deliverer, webhook_id: str, token: int, began: float) -> None:
        self.owner = owner
        self.webhook_id = webhook_id
        self.token = token
        self.trusted_until = began + owner.settings.lease_seconds * TRUSTED_SHARE
        self.task: asyncio.Task[None] | None = None
        self.label = ("", webhook_id)
        self._wake = asyncio.Event()
        self._lost = False
        # What was read when the runner (re)started.
        self.entry = webhook_pb2.Webhook()
        self.secrets = Secrets("")
        self.state = State()
        self.epoch = 0
        # Attempts not yet written, and the write under way.
        self._unwritten: deque[_Attempt] = deque()
        self._writing: asyncio.Task[None] | None = None

    def poke(self) -> None:
        self._wake.set()

    def lost(self) -> None:
        self._lost = True
        self._wake.set()
        if self.task is not None:
            self.task.cancel()

    # the loop ----------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            while True:
                await self._load()
                try:
                    await self._follow()
                except _RestartError:
                    await self._flush()
                    continue
        except (_StopError, LeaseLostError, asyncio.CancelledError):
            pass
        except Exception as exc:
            outage = self.owner.store.outage(exc)
            if outage is not None:
                log.warning("webhook %s: the store cannot be reached (%s); released", self.webhook_id, outage)
            else:
                log.exception("webhook %s: delivery failed; released for the next scan", self.webhook_id)
        finally:
            self.owner.ended(self)
            writing = self._writing
            if writing is not None:
                # What is being recorded is recorded before the lease goes (or fails with it).
                with contextlib.suppress(BaseException):
                    await asyncio.wait({writing})
                if writing.done() and not writing.cancelled():
                    writing.exception()
            if not self._lost:
                with contextlib.suppress(Exception):
                    await self.owner.store.write(
                        lambda store: store.release_lease(lease_name(self.webhook_id), self.token)
                    )

    async def _load(self) -> None:
        found = await self.owner.store.read(
            lambda store: (
                store.get(KIND, self.webhook_id),
                store.get(STATE_KIND, self.webhook_id),
                store.get(SECRET_KIND, self.webhook_id),
            )
        )
        record, state, secrets_ = found
        if record is None or state is None or secrets_ is None:
            raise _StopError
        self.entry = records.stored(record)
        if not self.entry.enabled:
            raise _StopError
        self.state = State.of(state)
        self.epoch = self.state.epoch
        self.secrets = Secrets.of(secrets_)
        self.label = (self.entry.meta.namespace, self.entry.name)
        self._wake.clear()

    async def _follow(self) -> None:
        where = self.entry.filter
        subscription = self.owner.events.subscribe(
            namespaces=frozenset({self.entry.meta.namespace}),
            plan_id=where.plan_id,
            session_id=where.session_id,
            event_types=list(where.event_type),
            after_sequence=self.state.cursor,
        )
        try:
            while True:
                batch = await self._next(subscription)
                for event in batch:
                    await self._deliver(event)
                self._publish_backlog()
        finally:
            subscription.close()

    async def _next(self, subscription: Subscription) -> list[events_pb2.Event]:
        """The next events, or a restart when the subscription changed (a poke: from this
        process's service at once, from the scan for other processes' changes)."""
        fetch = asyncio.ensure_future(subscription.next_batch())
        try:
            while True:
                waker = asyncio.ensure_future(self._wake.wait())
                done, _ = await asyncio.wait(
                    {fetch, waker},
                    timeout=self.owner.settings.scan_seconds,
                    return_when=asyncio.FIRST_COMPLETED,
                )
                waker.cancel()
                if fetch in done:
                    try:
                        return fetch.result()
                    except StopAsyncIteration:
                        raise _StopError from None
                    except ACPError as exc:
                        if exc.details.get("refinement") == "SUBSCRIBER_TOO_SLOW":
                            # Fell behind while a receiver was slow: read on from the store.
                            raise _RestartError from None
                        raise
                if self._lost:
                    raise _StopError
                if self._wake.is_set():
                    raise _RestartError
                self._publish_backlog()
        finally:
            if not fetch.done():
                fetch.cancel()
                with contextlib.suppress(BaseException):
                    await fetch

    def _publish_backlog(self) -> None:
        head = self.owner.events.delivered_sequence
        self.owner.stats.backlog[self.label] = max(0, head - self.state.cursor)

    async def _deliver(self, event: events_pb2.Event) -> None:
        ident = message_id(event.sequence)
        body = body_of(event)
        settings = self.owner.settings
        while True:
            failures = self.state.consecutive_failures
            if failures:
                wait = self.state.next_attempt_time - time.time()
                if wait > 0:
                    await self._sleep(wait)
            await self._trusted()
            now = time.time()
            headers = signing.headers(self.secrets.signing(now), ident, int(now), body)
            outcome = await sender.post(self.owner.egress, self.entry.url, headers, body, settings.limits)
            done = delivery(outcome, ident, event.sequence, event.type, failures + 1, now)
            self.owner.stats.results[RESULT_NAMES[done.result]] += 1
            if outcome.ok:
                committed = event.time.ToNanoseconds() / 1e9
                if self.owner.latency_observer is not None:
                    self.owner.latency_observer(max(0.0, time.time() - committed))
                self.state.cursor = event.sequence
                self.state.consecutive_failures = 0
                self.state.next_attempt_time = 0.0
                self.state.delivered += 1
                self.state.last_success_time = now
                await self._record(_Attempt(done, event.sequence))
                return
            failures += 1
            self.state.consecutive_failures = failures
            self.state.failed_attempts += 1
            self.state.last_failure_time = now
            self.state.last_error = outcome.error[:500]
            if outcome.status == 410:
                await self._record(_Attempt(done))
                await self._disable("the receiver answered 410 Gone")
            if failures >= settings.max_failures:
                await self._record(_Attempt(done))
                await self._disable(
                    f"{failures} consecutive failed attempts; the last: {outcome.error[:300]}"
                )
            self.state.next_attempt_time = now + settings.delay(failures)
            await self._record(_Attempt(done))

    async def _sleep(self, seconds: float) -> None:
        """Until the next attempt is due; a change of the subscription (a poke: from this
        process's service, or from the scan, which sees other processes' changes) ends the
        wait with a restart."""
        if self._wake.is_set():
            raise _RestartError
        try:
            await asyncio.wait_for(self._wake.wait(), seconds)
        except TimeoutError:
            return
        raise _RestartError

    async def _trusted(self) -> None:
        """Send only while the lease is surely ours: else wait for the next renewal."""
        while self.owner.clock() >= self.trusted_until:
            if self._lost:
                raise _StopError
            await asyncio.sleep(self.owner.settings.lease_seconds / 20)

    # bookkeeping -----------------------------------------------------------------------

    async def _record(self, attempt: _Attempt) -> None:
        writing = self._writing
        if writing is not None and writing.done() and writing.exception() is not None:
            await self._flush()
        self._unwritten.append(attempt)
        if self._writing is None or self._writing.done():
            self._writing = asyncio.ensure_future(self._write())
        if len(self._unwritten) >= MAX_UNWRITTEN:
            await self._flush()

    async def _flush(self) -> None:
        while True:
            writing = self._writing
            if writing is not None:
                await asyncio.wait({writing})
                failed = writing.exception()
                if failed is not None:
                    self._writing = None
                    raise failed
            if not self._unwritten:
                return
            self._writing = asyncio.ensure_future(self._write())

    async def _write(self) -> None:
        while self._unwritten:
            batch = list(self._unwritten)
            self._unwritten.clear()
            mine = State(**vars(self.state))
            changed = await self.owner.store.write(
                functools.partial(self._write_batch, batch=batch, mine=mine)
            )
            if changed:
                self.poke()

    def _write_batch(self, store: Store, *, batch: list[_Attempt], mine: State) -> bool:
        """In a write, fenced: the attempts into the history, and the state as delivery left
        it unless a caller changed the subscription since (its epoch): then only the counters.
        True when the caller's change was found."""
        name = lease_name(self.webhook_id)
        store.check_lease(name, self.token)
        found = store.get(STATE_KIND, self.webhook_id)
        if found is None or store.get(KIND, self.webhook_id) is None:
            return True
        current = State.of(found)
        rows = {}
        for attempt in batch:
            attempt.done.number = current.attempts
            current.attempts += 1
            rows[records.history_row(attempt.done.number)] = attempt.done.SerializeToString()
        if current.epoch == self.epoch:
            attempts, epoch = current.attempts, current.epoch
            current = State(**vars(mine))
            current.attempts, current.epoch = attempts, epoch
        store.put_items(records.HISTORY_COLLECTION, self.webhook_id, rows)
        put_state(store, self.webhook_id, self.entry.meta.namespace, current, time.time())
        return current.epoch != self.epoch

    async def _disable(self, reason: str) -> None:
        """Disable the subscription (fenced), with a ``webhook.disabled`` event; the runner ends."""
        await self._flush()
        state = State(**vars(self.state))

        def write(store: Store) -> None:
            store.check_lease(lease_name(self.webhook_id), self.token)
            record = store.get(KIND, self.webhook_id)
            found = store.get(STATE_KIND, self.webhook_id)
            if record is None or found is None:
                return
            current = State.of(found)
            if current.epoch != self.epoch:
                return
            entry = records.stored(record)
            entry.enabled = False
            entry.revision = record.revision + 1
            now = time.time()
            entry.meta.update_time.CopyFrom(records.timestamp(now))
            put(store, records.to_record(entry))
            state.disabled_reason = reason
            state.attempts = current.attempts
            state.epoch = current.epoch + 1
            state.next_attempt_time = 0.0
            put_state(store, self.webhook_id, entry.meta.namespace, state, now)
            self.owner.events.publish(
                events_pb2.Event(
                    namespace=entry.meta.namespace,
                    webhook_disabled=webhook_pb2.WebhookDisabled(
                        name=entry.name,
                        reason=reason,
                        consecutive_failures=state.consecutive_failures,
                        cursor=state.cursor,
                    ),
                )
            )

        await self.owner.store.write(write)
        log.warning("webhook %s/%s disabled: %s", *self.label, reason)
        raise _StopError
