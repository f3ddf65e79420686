"""A subscriber's side of the event log: the backlog, then live events, each exactly once
(how and why: the docstring of ``events/log.py``).

The log offers each event to every attached subscription under its lock (``offer``), ends
them when it closes (``end``), and reads their backlog (``EventLog.backlog``); the
subscription's reader takes events off its queue under the same lock, which the log hands
it at creation.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from types import TracebackType
from typing import Protocol

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.store.base import EventFilter
from cleveragents.acp.v1 import events_pb2


class Source(Protocol):
    """What a subscription needs of its event log (``events/log.py``'s ``EventLog``)."""

    queue_size: int

    @property
    def fanning_out(self) -> bool: ...

    async def backlog(
        self, after: int, where: EventFilter, shared: bool
    ) -> tuple[list[events_pb2.Event], int]: ...

    def detach(self, subscription: Subscription) -> None: ...


# Backlog rows read from the store per query: a shorter batch is the head of the log.
BACKLOG_BATCH = 256
# Events handed to a reader at once (``Subscription.next_batch``).
HAND_OUT_BATCH = BACKLOG_BATCH


class Subscription:
    """An async iterator of events: the backlog, then live events, each exactly once.

    The events it yields are shared with other subscribers: read them, do not modify them."""

    def __init__(self, log: Source, where: EventFilter, after_sequence: int, lock: threading.Lock) -> None:
        """``lock``: the log's, which guards this subscription's queue as well as the log's
        subscriber set (the log offers events holding it)."""
        self._log = log
        self._lock = lock
        self.filter = where
        self.after_sequence = after_sequence
        # The sequence of the last event handed to the reader.
        self.last_sequence = after_sequence
        # True once retention had dropped events this subscriber asked for.
        self.missed = False
        # Events to hand out, in order: a backlog batch, or live events moved from _queue.
        self._pending: deque[events_pb2.Event] = deque()
        # Filled by the producer (under the log's lock), bounded by the log's queue_size.
        self._queue: deque[events_pb2.Event] = deque()
        self._live = False
        # Live, but still handing out the last backlog batch: an overflow now is read
        # again from the store, as during catch-up (the reader has taken nothing live yet).
        self._settling = False
        self._overflowed = False
        self._closed = False
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0

    # producer side (called with the log's lock held) ----------------------------------

    def offer(self, event: events_pb2.Event) -> bool:
        """Queue the event if it passes the filter; False when this overflow ended the
        subscription, which the log then detaches."""
        if self._closed or self._overflowed:
            return True
        if not self.filter.matches(event.namespace, event.type, event.plan_id, event.session_id):
            return True
        attached = True
        if len(self._queue) < self._log.queue_size:
            self._queue.append(event)
        else:
            self._overflowed = True
            if self._live and not self._settling:
                # Ended: it keeps what it has queued, then learns where to resume.
                attached = False
            else:
                # Still reading the store (or handing out what it read), which holds all
                # of these: no need to keep them.
                self._queue.clear()
        self._wake()
        return attached

    def end(self) -> None:
        """Closed (by ``close``, or by the log as it closes): a waiting reader wakes and stops
        iterating. Called with the log's lock held."""
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done() or self._loop is None:
            return
        if threading.get_ident() == self._loop_thread:
            waiter.set_result(None)
        else:
            self._loop.call_soon_threadsafe(_resolve, waiter)

    # reader side ----------------------------------------------------------------------

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> events_pb2.Event:
        await self._fill()
        event = self._pending.popleft()
        self.last_sequence = event.sequence
        if self._settling and not self._pending:
            self._settle()
        return event

    async def next_batch(self) -> list[events_pb2.Event]:
        """The events ready to hand out, in order, at most ``HAND_OUT_BATCH`` (at least one:
        it waits for one); StopAsyncIteration once closed. What a reader holds is out of
        the queue, so the cap bounds how far past ``queue_size`` it may fall behind."""
        await self._fill()
        pending = self._pending
        if len(pending) <= HAND_OUT_BATCH:
            taken = list(pending)
            pending.clear()
        else:
            taken = [pending.popleft() for _ in range(HAND_OUT_BATCH)]
        self.last_sequence = taken[-1].sequence
        if self._settling and not pending:
            self._settle()
        return taken

    def _settle(self) -> None:
        """The last backlog batch is handed out: from now on the live rules apply. If the
        queue overflowed meanwhile, it was dropped: read on from the store."""
        with self._lock:
            self._settling = False
            if self._overflowed:
                self._overflowed = False
                self._live = False
                self._queue.clear()

    async def _fill(self) -> None:
        """Wait until events are pending; StopAsyncIteration once closed."""
        while True:
            if self._closed:
                raise StopAsyncIteration
            if self._pending:
                return
            if not self._live:
                # A long backlog is read batch by batch, each on a store reader thread.
                await self._catch_up()
                continue
            waiter = self._take_live()
            if waiter is not None:
                await waiter

    async def _catch_up(self) -> None:
        """Read one backlog batch from the store (off the loop, one snapshot); after a short
        one (the head of the log as of that read), switch to the live queue, which holds
        everything committed since unless it overflowed meanwhile. Until that batch is
        handed out the subscriber is settling: an overflow sends it back to the store."""
        after = self.last_sequence
        # Whether others read along is decided as the read starts: they may detach meanwhile.
        batch, first = await self._log.backlog(after, self.filter, self._log.fanning_out)
        if self._closed:
            return
        if not self.missed and after + 1 < first:
            self.missed = True
        self._pending.extend(batch)
        if len(batch) == BACKLOG_BATCH:
            return
        with self._lock:
            if self._overflowed:
                # Live events were dropped meanwhile; they are in the store: read on.
                self._overflowed = False
                self._queue.clear()
                return
            self._live = True
            self._settling = bool(batch)

    def _take_live(self) -> asyncio.Future[None] | None:
        """Move queued events to pending (dropping what the backlog gave), or a future to
        wait on; raises when the subscriber was ended for being too slow."""
        with self._lock:
            while self._queue:
                event = self._queue.popleft()
                if event.sequence > self.last_sequence:
                    self._pending.append(event)
            if self._pending or self._closed:
                return None
            if self._overflowed:
                raise ACPError(
                    ErrorCode.BUDGET_EXCEEDED,
                    f"subscriber fell more than {self._log.queue_size} events behind and was ended; "
                    f"resubscribe with after_sequence={self.last_sequence}",
                    {"last_sequence": self.last_sequence, "queue_size": self._log.queue_size},
                    refinement="SUBSCRIBER_TOO_SLOW",
                )
            self._loop = asyncio.get_running_loop()
            self._loop_thread = threading.get_ident()
            self._waiter = self._loop.create_future()
            return self._waiter

    def close(self) -> None:
        """Detach; a reader waiting on this subscription stops iterating."""
        self._log.detach(self)
        with self._lock:
            self.end()

    async def __aenter__(self) -> Subscription:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
