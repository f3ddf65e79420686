"""How the SQLite store's writes reach its one writer thread: group commit.

One writer thread owns the write connection: ``write`` queues a function, and the writer
runs every function queued while its previous commit ran (each in a savepoint, so one
failing undoes only its own writes) and commits them as one (one fsync for many calls). A
write asked for while the writer sleeps wakes it once its event loop has run what is ready
(at most ``HOLD`` later): the writes of that turn of the loop go in one commit. A write
lock held by another process is waited for on the writer thread, in short slices, up to
each call's deadline: then those calls fail with StoreBusyError and nothing of them was
written.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import itertools
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from cleveragents.acp.facade.store.base import Record, Store, StoreBusyError, StoreFullError
from cleveragents.acp.facade.store.delivery import CommitOrder, Job
from cleveragents.acp.facade.store.sql_store import SQLStore

T = TypeVar("T")

# The most writes one commit takes: bounds how long the first of them waits for the last.
MAX_BATCH = 256
# How long a write asked for while the writer sleeps waits at most for its busy loop to
# run out of ready callbacks before the writer is woken.
HOLD = 0.0005
# SQLite's primary result code for a full disk (ENOSPC on the database, journal or WAL).
_SQLITE_FULL = 13


def _disk_full(exc: BaseException) -> bool:
    return (
        isinstance(exc, sqlite3.Error) and (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == _SQLITE_FULL
    )


# Lock contention with another connection or process, which passes: SQLITE_PROTOCOL is what
# a WAL-index lock race answers after SQLite's own retries (seen opening a file beside a
# process frozen mid-write on a loaded machine), as transient as SQLITE_BUSY.
_CONTENDED = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_PROTOCOL})


def busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _CONTENDED
    text = str(exc)
    return "locked" in text or "busy" in text or "locking protocol" in text


class _Insert:
    """``insert(record)`` with nothing read before it (``insert_alone``): the writer makes
    those of a batch that follow one another together (``GroupCommit._insert_together``)."""

    __slots__ = ("record",)

    def __init__(self, record: Record) -> None:
        self.record = record

    def __call__(self, store: Store) -> None:
        store.insert(self.record)


def _is_insert(job: Job) -> bool:
    return type(job.fn) is _Insert


class GroupCommit(SQLStore):
    """The write side of ``SQLiteStore``."""

    # The store's (sqlite.py): the write connection and the transaction open on it.
    write_timeout: float
    _db: sqlite3.Connection
    _lock: threading.RLock
    _depth: int
    _owner_thread: int | None
    _owner: asyncio.Task[Any] | None
    _after_commit: list[Callable[[], None]]
    _appended: bool
    _order: CommitOrder
    _closing: bool

    def _open_writer(self) -> None:
        """The queue of writes; the writer thread starts on the first ``write``."""
        self._queue: collections.deque[Job] = collections.deque()
        self._wake = threading.Condition()
        self._writer: threading.Thread | None = None
        # The writer waits for work and nobody woke it yet (under ``_wake``); the loops
        # whose wake-up of it is held until they run out of ready callbacks.
        self._sleeping = False
        self._holding: set[asyncio.AbstractEventLoop] = set()

    @abc.abstractmethod
    def _insert_records(self, records: Sequence[Record]) -> None:
        """Rows and tags of new records (in the write transaction)."""

    @abc.abstractmethod
    def _committed(self) -> None:
        """After a durable commit."""

    async def insert_alone(self, record: Record) -> None:
        await self.write(_Insert(record))

    async def write(self, fn: Callable[[Store], T]) -> T:
        loop = asyncio.get_running_loop()
        job = Job(fn, loop, time.monotonic() + self.write_timeout)
        with self._wake:
            if self._closing:
                raise RuntimeError("the store is closed")
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_loop, name="acp-store-write", daemon=True)
                self._writer.start()
            self._queue.append(job)
            if self._sleeping:
                self._wake_writer(loop)
        assert job.future is not None
        try:
            result = await job.future
        except sqlite3.Error as exc:
            if not _disk_full(exc):
                raise
            self.note_full()
            raise StoreFullError(str(exc)) from None
        if self.full is not None:
            self.full = None
        return cast(T, result)

    def _wake_writer(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wake the sleeping writer now if ``loop`` has nothing else ready, else once it has
        run what is (under ``_wake``). Woken at once, the writer took the first write alone
        to its fsync while the loop's next ones waited for another, and found the GIL held
        by the loop at each statement (asyncio's loops keep their ready callbacks in
        ``_ready``; a loop without one wakes the writer at once)."""
        if not getattr(loop, "_ready", None):
            self._sleeping = False
            self._wake.notify()
        elif loop not in self._holding:
            self._holding.add(loop)
            loop.call_soon(self._release, loop, time.monotonic() + HOLD)

    def _release(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        if getattr(loop, "_ready", None) and time.monotonic() < deadline:
            loop.call_soon(self._release, loop, deadline)
            return
        with self._wake:
            self._holding.discard(loop)
            self._sleeping = False
            self._wake.notify()

    def _write_loop(self) -> None:
        while True:
            with self._wake:
                while not self._queue and not self._closing:
                    self._sleeping = True
                    self._wake.wait()
                    self._sleeping = False
                if not self._queue:
                    return
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), MAX_BATCH))]
            self._commit(batch)

    def _commit(self, batch: list[Job]) -> None:
        """Run a batch in one transaction; due in commit order once it is durable."""
        with self._lock:
            batch = self._begin_batch(batch)
            if batch:
                began = time.monotonic()
                observer = self.observer
                if observer is not None:
                    for job in batch:
                        observer.waited("write", began - job.queued)
                self._run_batch(batch)
                if observer is not None:
                    observer.committed(time.monotonic() - began)
            # Still under the write lock: the due queue is in commit order.
            self._order.due(batch)
        self._order.announce(batch)

    def _begin_batch(self, batch: list[Job]) -> list[Job]:
        """Start the transaction; calls that waited their whole bound fail meanwhile."""
        while True:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                return batch
            except sqlite3.OperationalError as exc:
                if not busy(exc):
                    for job in batch:
                        job.error = exc
                    self._order.settle(batch)
                    return []
            now = time.monotonic()
            expired = [job for job in batch if job.deadline <= now]
            for job in expired:
                job.error = StoreBusyError(self.write_timeout)
            self._order.settle(expired)
            batch = [job for job in batch if job.deadline > now]
            if not batch:
                return []

    def _run_batch(self, batch: list[Job]) -> None:
        """Each call in a savepoint, so one failing undoes only its own writes; a call alone
        in its transaction needs none. Each statement costs the writer GIL hand-offs with
        the busy loop (a sleep and a wake-up each), so inserts that follow one another go
        in a few statements together (``_insert_together``)."""
        self._depth, self._owner_thread, self._owner = 1, threading.get_ident(), None
        try:
            if len(batch) == 1:
                self._run_alone(batch[0])
            else:
                for inserts, group in itertools.groupby(batch, _is_insert):
                    jobs = list(group)
                    if inserts and len(jobs) > 1 and self._insert_together(jobs):
                        continue
                    for job in jobs:
                        self._run_in_savepoint(job)
            if len(batch) == 1 and batch[0].error is not None:
                # The call alone failed: its transaction was rolled back.
                self._appended = False
            else:
                self._db.execute("COMMIT")
                self._committed()
        except BaseException as exc:  # the commit failed: nothing is durable
            self._appended = False
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            for job in batch:
                job.callbacks = []
                if job.error is None:
                    job.error = exc
        finally:
            self._depth, self._owner_thread, self._after_commit = 0, None, []

    def _run_alone(self, job: Job) -> None:
        self._after_commit = []
        try:
            job.result = job.run(self)
            job.callbacks = self._after_commit
        except BaseException as exc:  # handed to the caller
            job.error = exc
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")

    def _run_in_savepoint(self, job: Job) -> None:
        self._after_commit = []
        self._db.execute("SAVEPOINT job")
        try:
            job.result = job.run(self)
            job.callbacks = self._after_commit
        except BaseException as exc:  # handed to the caller
            job.error = exc
            self._db.execute("ROLLBACK TO job")
        self._db.execute("RELEASE job")

    def _insert_together(self, jobs: list[Job]) -> bool:
        """``_Insert`` calls in one savepoint: their records in one statement, their tags in
        another, and the request rows of those under a request id (``note_claim``, in the
        caller's context). False when any of it failed (an id or name taken, a request id
        another run holds, ...): then nothing of it is kept, and each call is to be made
        alone, in its own savepoint, to meet only its own fault."""
        records = [cast(_Insert, job.fn).record for job in jobs]
        self._db.execute("SAVEPOINT together")
        try:
            self._insert_records(records)
            for job, record in zip(jobs, records, strict=True):
                job.context.run(self.note_claim, record.kind, record.id, record.body)
        except Exception:
            self._db.execute("ROLLBACK TO together")
            self._db.execute("RELEASE together")
            return False
        self._db.execute("RELEASE together")
        for job in jobs:
            job.result, job.callbacks = None, []
        return True
