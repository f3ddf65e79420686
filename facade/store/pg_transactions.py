"""How the PostgreSQL store's calls get a connection and a transaction.

- ``read(fn)``: one ``REPEATABLE READ, READ ONLY`` transaction on a reader thread, so every
  statement of ``fn`` sees one snapshot and none waits for a writer; its BEGIN goes with its
  first statement and its COMMIT is not waited for (pg_wire.py).
- ``write(fn)``: one ``READ COMMITTED`` transaction on a writer thread, its BEGIN sent with
  its first statement, in one round trip; committed (durably) before ``write`` returns.
- The store's reader and writer threads each keep one pooled connection (``_borrow``);
  ``transaction()`` joins the write open on its thread, else blocks its thread for one.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import psycopg
from psycopg import errors, pq
from psycopg_pool import ConnectionPool, PoolTimeout

from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.store.base import Store, StoreBusyError, StoreDownError, StoreFullError
from cleveragents.acp.facade.store.delivery import CommitOrder, Job, current_task, done, run_callback
from cleveragents.acp.facade.store.pg_errors import BUSY, first_line, reraise, store_error
from cleveragents.acp.facade.store.pg_wire import PSYCOPG, Wire
from cleveragents.acp.facade.store.reads import ReadLane
from cleveragents.acp.facade.store.sql_store import SQLStore

log = logging.getLogger(__name__)
T = TypeVar("T")

# A read's transaction: one snapshot for all its statements, which wait for no writer.
BEGIN_READ = b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
IN_TRANSACTION = (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)
# The one connection attempt that tells a starved pool from a database that is down.
_STARVED_CONNECT_TIMEOUT = 3


def _command(conn: psycopg.Connection[Any], command: bytes) -> None:
    """A statement without parameters or rows (BEGIN, COMMIT) straight through libpq: a
    third of what ``conn.execute`` costs, paid twice by every read and write."""
    result = conn.pgconn.exec_(command)
    if result.status != pq.ExecStatus.COMMAND_OK:
        raise errors.error_from_result(result, encoding=conn.info.encoding)


def _rollback(conn: psycopg.Connection[Any]) -> None:
    """Roll back after a failure; a broken connection (rolled back by the server when it
    went) must not hide the failure that matters, and the pool discards it."""
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error as exc:
        log.warning("rollback failed: %s", exc)


class _Thread(threading.local):
    """The transactions open on one thread: a read snapshot, a write (possibly nested)."""

    def __init__(self) -> None:
        self.read: psycopg.Connection[Any] | None = None
        self.write: psycopg.Connection[Any] | None = None
        self.depth = 0
        self.owner: asyncio.Task[Any] | None = None
        self.callbacks: list[Callable[[], None]] = []
        # A thread of the store's own pools keeps a connection (``pinned``) while it lives.
        self.own = False
        self.pinned: psycopg.Connection[Any] | None = None
        self.busy = False
        # The open write transaction appended events (its commit takes the commit lock).
        self.appended = False
        # The open read's transaction has begun (with its first statement).
        self.began = False
        # The open write's transaction has begun (its BEGIN goes with its first statement).
        self.write_began = False


class PgTransactions(SQLStore):
    """The connections and transactions of ``PostgresStore``."""

    # The store's (postgres.py).
    url: str
    write_timeout: float
    _pool: ConnectionPool[psycopg.Connection[Any]]
    _order: CommitOrder
    _closing: bool
    _closed: bool

    def _open_threads(self, readers: int, writers: int) -> None:
        """The reader and writer threads and what they keep per thread."""
        self._thread = _Thread()
        # Taken around committing (and queueing the callbacks of) a transaction that appended
        # events: those commit one at a time anyway (the sequence row's lock), and this keeps
        # their callbacks queued in commit, so sequence, order. Others commit concurrently,
        # so PostgreSQL can flush their commits together.
        self._commit_lock = threading.Lock()
        self._wire = Wire()
        self._pinned: set[psycopg.Connection[Any]] = set()
        self._pinned_lock = threading.Lock()
        self._reads = ReadLane(readers, "acp-store-read")
        self._writers = ThreadPoolExecutor(writers, "acp-store-write", initializer=self._own_thread)

    async def read(self, fn: Callable[[Store], T], *, urgent: bool = False) -> T:
        if self._closing:
            raise RuntimeError("the store is closed")
        # The caller's context travels with fn (its trace, read by what fn records).
        context = contextvars.copy_context()
        queued = time.monotonic()
        try:
            return await self._reads.run(
                functools.partial(context.run, self._read_now, fn, queued), urgent=urgent
            )
        except Exception as exc:
            reraise(exc, queued)

    def _read_now(self, fn: Callable[[Store], T], queued: float) -> T:
        here = self._thread
        # The read lane's threads are the store's own: each keeps its connection.
        here.own = True
        # The transaction begins with fn's first statement, in its round trip (``_run``), and
        # its COMMIT is not waited for on the thread's own connection (pg_wire.py).
        with self._borrow(settle=False) as conn:
            observer = self.observer
            if observer is not None:
                observer.waited("read", time.monotonic() - queued)
            here.read, here.began = conn, False
            try:
                result = fn(self)
            except BaseException:
                here.read = None
                if here.began:
                    _rollback(conn)
                raise
            here.read = None
            if here.began:
                if conn is here.pinned:
                    self._wire.commit_later(conn)
                else:
                    _command(conn, b"COMMIT")
            return result

    async def write(self, fn: Callable[[Store], T]) -> T:
        job = Job(
            fn,
            asyncio.get_running_loop(),
            time.monotonic() + self.write_timeout,
        )
        if self._closing:
            raise RuntimeError("the store is closed")
        self._writers.submit(self._write_now, job)
        assert job.future is not None
        try:
            result = await job.future
        except Exception as exc:
            # A statement's own failure arrives mapped already (``reraise`` in the thread).
            if isinstance(exc, StoreFullError):
                self.note_full()
            mapped = store_error(exc, job.queued)
            if mapped is None:
                raise
            if isinstance(mapped, StoreFullError):
                self.note_full()
            raise mapped from None
        if self.full is not None:
            self.full = None
        return cast(T, result)

    def _write_now(self, job: Job) -> None:
        """Run one write in its own transaction; due in commit order once committed."""
        here = self._thread
        committed = False
        try:
            with self._borrow(max(0.0, job.deadline - time.monotonic())) as conn:
                began = time.monotonic()
                observer = self.observer
                if observer is not None:
                    observer.waited("write", began - job.queued)
                here.write, here.depth, here.owner, here.callbacks = conn, 1, None, []
                here.write_began = False
                try:
                    job.result = job.run(self)
                except BaseException as exc:  # handed to the caller
                    job.error = exc
                    if here.write_began:
                        _rollback(conn)
                else:
                    job.callbacks = here.callbacks
                    self._commit(conn, [job])
                    committed = True
                    if observer is not None:
                        observer.committed(time.monotonic() - began)
                finally:
                    here.write, here.depth, here.callbacks, here.appended = None, 0, [], False
                    here.write_began = False
        except BaseException as exc:  # the commit (or the connection) failed: nothing is durable
            if job.error is None:
                job.error = exc
        if committed:
            self._order.announce([job])
        else:
            self._order.settle([job])

    def _commit(self, conn: psycopg.Connection[Any], jobs: list[Job]) -> None:
        """Commit, then queue the jobs' callbacks and answers (in sequence order when the
        transaction appended events). A transaction that ran no statement never began."""
        lock = self._commit_lock if self._thread.appended else contextlib.nullcontext()
        started = time.monotonic()
        with lock:
            try:
                if self._thread.write_began:
                    _command(conn, b"COMMIT")
            except BUSY:
                raise StoreBusyError(time.monotonic() - started) from None
            self._order.due(jobs)

    def _starved(self, waited: float) -> ACPError:
        """No pooled connection came within the bound: every one in use (STORE_BUSY), or
        none can be made, the database being down (STORE_UNAVAILABLE; one connection
        attempt tells, on this store thread)."""
        try:
            psycopg.connect(self.url, autocommit=True, connect_timeout=_STARVED_CONNECT_TIMEOUT).close()
        except psycopg.OperationalError as exc:
            return StoreDownError(first_line(exc))
        return StoreBusyError(waited, "no database connection of this server came free")

    @contextmanager
    def _borrow(
        self, timeout: float | None = None, *, settle: bool = True
    ) -> Iterator[psycopg.Connection[Any]]:
        """A connection for one transaction or statement. The store's own reader and writer
        threads each keep one (taking it from the pool once, not per call: the pool's
        checkout costs about what a statement does); other threads, and a store thread
        needing a second one (a write inside a read), take one from the pool and give it
        back. Waiting longer than the write bound for one is STORE_BUSY. A kept connection
        comes with the answer to its last read's COMMIT read, unless ``settle`` is False
        (a read, which reads it with its first statement)."""
        if self._closed:
            raise RuntimeError("the store is closed")
        wait = self.write_timeout if timeout is None else timeout
        here = self._thread
        if not here.own or here.busy:
            try:
                with self._pool.connection(timeout=wait) as borrowed:
                    yield borrowed
            except PoolTimeout:
                raise self._starved(wait) from None
            return
        kept = here.pinned
        if kept is None or kept.closed or kept.broken:
            if kept is not None:
                self._unpin(kept)
            try:
                conn = self._pool.getconn(timeout=wait)
            except PoolTimeout:
                raise self._starved(wait) from None
            with self._pinned_lock:
                self._pinned.add(conn)
            here.pinned = conn
        else:
            conn = kept
        here.busy = True
        try:
            if settle:
                self._wire.settle(conn)
            yield conn
        finally:
            here.busy = False
            if conn.broken or conn.closed:
                self._unpin(conn)
                here.pinned = None
            # (A read's COMMIT on its way is left for the next use to read: pg_wire.py.)
            elif not self._wire.owes(conn) and conn.info.transaction_status != pq.TransactionStatus.IDLE:
                _rollback(conn)

    def _unpin(self, conn: psycopg.Connection[Any]) -> None:
        """Hand a kept connection back: the pool replaces it when it is broken."""
        with self._pinned_lock:
            self._pinned.discard(conn)
        self._pool.putconn(conn)

    def _own_thread(self) -> None:
        """Marks a thread of the store's reader or writer pool (ThreadPoolExecutor's initializer)."""
        self._thread.own = True

    # transactions ---------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Inside ``write`` it joins the call's transaction; elsewhere it blocks its thread
        for a connection and commits at its end. A transaction belongs to the task that
        opened it: another task of the same thread touching the store meanwhile (the opener
        awaited inside it) is refused, instead of joining it or reading its writes."""
        here = self._thread
        if here.depth:
            self._check_owner()
            here.depth += 1
            try:
                yield
            finally:
                here.depth -= 1
            return
        with self._borrow() as conn:
            here.write, here.depth, here.owner, here.callbacks = conn, 1, current_task(), []
            here.write_began = False
            try:
                yield
            except BaseException:
                here.callbacks = []
                if here.write_began:
                    _rollback(conn)
                raise
            else:
                self._commit(conn, [done(here.callbacks)])
            finally:
                here.write, here.depth, here.owner, here.callbacks, here.appended = None, 0, None, [], False
                here.write_began = False
        self._order.drain()

    def after_commit(self, callback: Callable[[], None]) -> None:
        here = self._thread
        if here.depth:
            self._check_owner()
            here.callbacks.append(callback)
        else:
            run_callback(callback)

    def _check_owner(self) -> None:
        if current_task() is not self._thread.owner:
            raise RuntimeError(
                "the store is inside a transaction another task opened; "
                "a transaction must not be held across an await"
            )

    def _run(self, statement: Any, params: Sequence[Any] | Mapping[str, Any], fetch: str) -> Any:
        """One statement: in this thread's write transaction, else its read snapshot, else
        on a connection borrowed for it alone (autocommit)."""
        here = self._thread
        if here.depth:
            self._check_owner()
            conn = cast(psycopg.Connection[Any], here.write)
            if here.write_began:
                return self._on(conn, statement, params, fetch)
            # A write's BEGIN goes with its first statement, in one round trip.
            try:
                return self._on(conn, statement, params, fetch, b"BEGIN")
            finally:
                # Begun unless it failed before anything was sent.
                here.write_began = conn.info.transaction_status in IN_TRANSACTION
        if here.read is not None:
            if here.began:
                return self._on(here.read, statement, params, fetch)
            try:
                return self._on(here.read, statement, params, fetch, BEGIN_READ)
            finally:
                # Begun unless it failed before anything was sent.
                here.began = here.read.info.transaction_status in IN_TRANSACTION
        with self._borrow() as conn:
            return self._on(conn, statement, params, fetch)

    def _on(
        self,
        conn: psycopg.Connection[Any],
        statement: Any,
        params: Any,
        fetch: str,
        begin: bytes | None = None,
    ) -> Any:
        """One statement on ``conn``; after ``begin`` (a transaction's BEGIN) when given."""
        started = time.monotonic()
        try:
            if isinstance(statement, str) and not isinstance(params, Mapping):
                result = self._wire.run(conn, statement, params, fetch, begin)
                if result is not PSYCOPG:
                    return result
            if begin is not None:
                self._wire.settle(conn)
                _command(conn, begin)
            cursor = conn.execute(statement, params)
            if fetch == "one":
                return cursor.fetchone()
            if fetch == "all":
                return cursor.fetchall()
            return cursor.rowcount
        except Exception as exc:
            reraise(exc, started)

    def _one(self, statement: Any, params: Sequence[Any] | Mapping[str, Any] = ()) -> Any:
        return self._run(statement, params, "one")

    def _all(self, statement: Any, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[Any]:
        return cast(list[Any], self._run(statement, params, "all"))

    def _count(self, statement: Any, params: Sequence[Any] | Mapping[str, Any] = ()) -> int:
        return int(self._run(statement, params, "count"))

    def execute(self, statement: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one statement where the store would (tests, tools); its rows, if any."""
        return cast(list[Any], self._run(statement, params, "all"))

    # records --------------------------------------------------------------------------

    def _locked(self, statement: str) -> str:
        """In a write transaction a record read is locked until it ends (``FOR UPDATE``), so
        a read-modify-write (a session's message count, a plan's state) sees the newest
        version and no other replica's write slips between the read and the write: what
        SQLite's one writer gives for free. Reads in ``read`` lock nothing."""
        return statement + " FOR UPDATE" if self._thread.depth else statement
