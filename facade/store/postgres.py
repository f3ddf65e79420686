"""The store for many replicas: one PostgreSQL database (or one schema of it).

The same ``Store`` as ``SQLiteStore``, built the way PostgreSQL wants to be used: a pool
of connections (psycopg_pool) driven from two small thread pools, so the event loop never
waits and several writes are in flight at once (PostgreSQL commits them concurrently; no
group-commit writer thread is needed).

- ``read(fn)``: one ``REPEATABLE READ, READ ONLY`` transaction, so every statement of
  ``fn`` sees one snapshot and none waits for a writer. The plain reads (``read_get``,
  ``read_with_items``, ``read_query``...) need no thread: the event loop sends them on
  connections of its own in libpq's nonblocking pipeline mode (pg_loop.py).
- A write's ``BEGIN`` goes with its first statement, in one round trip.
- ``write(fn)``: one ``READ COMMITTED`` transaction; the commit is durable
  (``synchronous_commit`` at least ``on``, whatever the server's default) before ``write``
  returns. Conditional writes lock what they check: ``update``/``delete`` are one
  ``UPDATE``/``DELETE ... WHERE revision = ...``, ``append_items`` takes a per-owner
  advisory lock, ``append_events`` updates the one-row ``event_sequence`` counter, whose
  row lock, held to commit, hands sequences out in commit order (docs/events.md, "Across
  replicas").
- A lock held elsewhere is waited for at most ``write_timeout`` (``lock_timeout``; a
  deadlock or serialization failure counts the same): then the call fails with the
  retryable StoreBusyError, having written nothing. A transaction left waiting on its
  replica (frozen, cut off, dead) is ended by the server after ``idle_timeout``, freeing
  its locks (pg_settings.py).
- ``after_commit`` callbacks run on the caller's loop in commit order where order exists:
  transactions that appended events commit one at a time (the counter's row lock, and in
  this process a lock around ``COMMIT`` and queueing the callbacks), so their callbacks run
  in sequence order. Other transactions commit concurrently (PostgreSQL flushes their
  commits together) and queue theirs as they finish.

The URL is any libpq URL (``postgresql://user@host:5432/db?options=-csearch_path%3Dacp``);
tables live in the first schema of its search path, created when missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import orjson
import psycopg
from psycopg import errors, pq, sql
from psycopg.types.json import Jsonb, set_json_dumps, set_json_loads
from psycopg_pool import ConnectionPool, PoolTimeout

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.store import rows
from cleveragents.acp.facade.store.base import (
    DEFAULT_WRITE_TIMEOUT,
    EventFilter,
    EventWakeups,
    Lease,
    ListQuery,
    Record,
    SchemaTooNewError,
    StaleRevisionError,
    Store,
    StoreBusyError,
    StoreConflictError,
    StoredEvent,
    StoreDownError,
    StoreFullError,
    StoreUnavailableError,
)
from cleveragents.acp.facade.store.delivery import CommitOrder, Job, current_task, done, run_callback
from cleveragents.acp.facade.store.pg_loop import CUSTOM_PLANS, LoopReads, LoopWrites, Rows
from cleveragents.acp.facade.store.pg_migrations import PG_MIGRATIONS
from cleveragents.acp.facade.store.pg_settings import DEFAULT_IDLE_SECONDS, connection_info
from cleveragents.acp.facade.store.pg_urls import is_postgres_url, redacted
from cleveragents.acp.facade.store.pg_wire import PSYCOPG, Fallback, NulInTextError, Wire
from cleveragents.acp.facade.store.reads import ReadLane
from cleveragents.acp.facade.store.requests import CLAIM
from cleveragents.acp.facade.store.sql_store import SQLStore
from cleveragents.acp.facade.store.statements import POSTGRES, Statements

log = logging.getLogger(__name__)
T = TypeVar("T")

_SQL = Statements(POSTGRES)
_EVENT_COLUMNS = "sequence, namespace, type, plan_id, session_id, time, body"
# How long opening a connection may take before the store gives up on the server.
CONNECT_TIMEOUT = 10
# The one connection attempt that tells a starved pool from a database that is down.
_STARVED_CONNECT_TIMEOUT = 3
# How long a replica waits for another one's migration before it gives up.
MIGRATION_WAIT = 300.0
# The statements the event loop sends itself (pg_loop.py) as well as the store threads.
_ITEMS = _SQL.items
_GET = _SQL.get
_BY_NAME = _SQL.get_by_name
# ON CONFLICT DO NOTHING (every unique index): a clash leaves the transaction usable, as
# SQLite's does, for callers that catch StoreConflictError and go on.
_INSERT = (
    f"INSERT INTO records ({rows.COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT DO NOTHING"
)
# A read's transaction: one snapshot for all its statements, which wait for no writer.
_BEGIN_READ = b"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
_IN_TRANSACTION = (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)
# Failures that mean "another transaction was in the way": nothing was written, retry.
_BUSY = (errors.LockNotAvailable, errors.DeadlockDetected, errors.SerializationFailure)


def first_schema(search_path: str) -> str | None:
    """The first schema a ``search_path`` setting names (``$user`` aside), unquoted."""
    names: list[str] = []
    current, quoted, i = "", False, 0
    while i < len(search_path):
        char = search_path[i]
        if quoted:
            if char == '"' and search_path[i + 1 : i + 2] == '"':
                current += '"'
                i += 1
            elif char == '"':
                quoted = False
            else:
                current += char
        elif char == '"':
            quoted = True
        elif char == ",":
            names.append(current.strip())
            current = ""
        else:
            current += char
        i += 1
    names.append(current.strip())
    return next((name for name in names if name and name != "$user"), None)


def _record(row: Sequence[Any]) -> Record:
    return rows.record(row, rows.as_decoded)


def _insert_params(record: Record) -> tuple[Any, ...]:
    return rows.record_params(record, Jsonb)


def _clash(record: Record) -> StoreConflictError:
    return StoreConflictError(
        f"a {record.kind} with id {record.id} or name {record.name!r} exists in {record.namespace!r}"
    )


def _event(row: Sequence[Any]) -> StoredEvent:
    return StoredEvent(int(row[0]), row[1], row[2], row[3], row[4], float(row[5]), bytes(row[6]))


def _query_statement(query: ListQuery) -> tuple[str, list[Any]] | None:
    """``query``'s statement and parameters; None when it can match nothing."""
    where = ["kind = %s"]
    params: list[Any] = [query.kind]
    if query.namespaces is not None:
        if not query.namespaces:
            return None
        where.append("namespace = ANY(%s::text[])")
        params.append(sorted(query.namespaces))
    if query.state:
        where.append("state = %s")
        params.append(query.state)
    if query.attrs:
        where.append("attrs @> %s")
        params.append(Jsonb(dict(query.attrs)))
    if query.labels:
        where.append("labels @> %s")
        params.append(Jsonb(dict(query.labels)))
    if query.by_name:
        where.append("name IS NOT NULL")
        if query.after_name is not None:
            where.append("(namespace, name) > (%s, %s)")
            params.extend(query.after_name)
        order = "namespace, name"
    else:
        if query.before_id:
            where.append("id < %s")
            params.append(query.before_id)
        order = "id DESC"
    params.append(query.limit)
    return f"SELECT {rows.COLUMNS} FROM records WHERE {' AND '.join(where)} ORDER BY {order} LIMIT %s", params


class NulCharacterError(ACPError):
    """A value for a text column holds U+0000, which PostgreSQL cannot store (nor look up)."""

    def __init__(self) -> None:
        super().__init__(
            ErrorCode.INVALID_PARAMS,
            "a name, id, label or attribute holds a NUL character (U+0000), which this server's "
            "PostgreSQL store cannot keep",
            {"reason": "NUL_CHARACTER"},
        )


def _unreachable(exc: BaseException) -> bool:
    """The connection is gone or the server refuses work: a restart, a failover, a network
    cut (no SQLSTATE, class 08, or an operator's shutdown, 57P01-57P03). A statement sent
    through libpq directly (pg_wire.py) reports a lost connection as a bare DatabaseError
    with no SQLSTATE."""
    if isinstance(exc, _BUSY) or not isinstance(exc, psycopg.DatabaseError):
        return False
    if not isinstance(exc, psycopg.OperationalError) and type(exc) is not psycopg.DatabaseError:
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _store_error(exc: Exception, started: float) -> Exception | None:
    """What a statement's failure is to the store's callers; None: itself."""
    if isinstance(exc, errors.UniqueViolation):
        return StoreConflictError(str(exc).splitlines()[0])
    if isinstance(exc, _BUSY):
        return StoreBusyError(time.monotonic() - started)
    if isinstance(exc, errors.DiskFull):
        return StoreFullError(_first_line(exc))
    if _unreachable(exc):
        return StoreDownError(_first_line(exc))
    if isinstance(exc, NulInTextError):
        return NulCharacterError()
    # PostgreSQL's text (and jsonb) cannot hold U+0000, which SQLite's can: a value with one
    # is refused as the caller's, never an internal error.
    if isinstance(exc, psycopg.DataError) and ("NUL" in str(exc) or "\\u0000" in str(exc)):
        return NulCharacterError()
    return None


def _lock_timeout_ms(write_timeout: float) -> int:
    return max(1, round(write_timeout * 1000))


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


# A write is acknowledged once durable (docs/events.md), whatever default the
# server, the database or the URL's options set: ``off`` is raised to ``on`` (``local`` and
# the standby levels flush locally already, and are kept).
DURABLE_COMMITS = (
    "SELECT set_config('synchronous_commit', 'on', false) WHERE current_setting('synchronous_commit') = 'off'"
)


class PostgresStore(SQLStore):
    sql = _SQL
    # jsonb comes back decoded (psycopg's loader, pg_wire's decoder).
    read_maps = staticmethod(rows.as_decoded)

    def __init__(
        self,
        url: str,
        *,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
        idle_timeout: float = DEFAULT_IDLE_SECONDS,
        readers: int = 4,
        writers: int = 4,
        loop_connections: int = 2,
    ) -> None:
        if not is_postgres_url(url):
            raise ValueError(f"not a PostgreSQL URL: {redacted(url)}")
        self.url = url
        self.write_timeout = write_timeout
        # What every connection is opened with (pg_settings.py): the bound on how long a
        # replica that stopped answering inside a transaction keeps its locks.
        self.idle_timeout = idle_timeout
        self._conninfo = connection_info(url, idle_timeout)
        self._thread = _Thread()
        self._order = CommitOrder()
        # Taken around committing (and queueing the callbacks of) a transaction that appended
        # events: those commit one at a time anyway (the sequence row's lock), and this keeps
        # their callbacks queued in commit, so sequence, order. Others commit concurrently,
        # so PostgreSQL can flush their commits together.
        self._commit_lock = threading.Lock()
        self._closing = False
        self._closed = False
        try:
            self.schema, self.channel = self.migrate()
        except psycopg.Error as exc:
            raise StoreUnavailableError(f"cannot open {redacted(url)}: {exc}".strip()) from exc
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            self._conninfo,
            min_size=1,
            # Every reader and writer thread, plus callers blocking outside them.
            max_size=readers + writers + 2,
            kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT},
            configure=self._configure,
            open=False,
            name="acp-store",
        )
        self._pool.open()
        self._wire = Wire()
        self._pinned: set[psycopg.Connection[Any]] = set()
        self._pinned_lock = threading.Lock()
        self._reads = ReadLane(readers, "acp-store-read")
        # The plain reads (``read_get`` and the like) each event loop drives itself (pg_loop.py).
        self._loop_connections = loop_connections
        self._loops: dict[asyncio.AbstractEventLoop, LoopReads] = {}
        # A record insert with nothing read before it, the same way (``insert_alone``).
        self._loop_writes: dict[asyncio.AbstractEventLoop, LoopWrites] = {}
        self._write_setup = (
            f"SET lock_timeout = {_lock_timeout_ms(write_timeout)}",
            CUSTOM_PLANS,
            DURABLE_COMMITS,
        )
        self._loops_lock = threading.Lock()
        self._writers = ThreadPoolExecutor(writers, "acp-store-write", initializer=self._own_thread)

    def __repr__(self) -> str:
        return f"PostgresStore({redacted(self.url)!r})"

    def outage(self, exc: BaseException) -> str | None:
        # A server restarting or gone: the connection refused, shutting down, or lost (libpq's
        # "server closed the connection unexpectedly": a bare DatabaseError, no SQLSTATE).
        lost = type(exc) is psycopg.DatabaseError and exc.sqlstate is None
        if lost or isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError | PoolTimeout):
            text = str(exc).strip().splitlines()
            return f"{type(exc).__name__}: {text[0] if text else 'the connection was lost'}"
        return super().outage(exc)

    # connections and schema -----------------------------------------------------------

    def _connect(self) -> psycopg.Connection[Any]:
        try:
            conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT)
        except psycopg.OperationalError as exc:
            raise StoreUnavailableError(f"cannot connect to {redacted(self.url)}: {exc}".strip()) from None
        self._configure(conn)
        return conn

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        # psycopg prepares nothing of its own here: after a rollback on a connection where it
        # has, it sends DEALLOCATE ALL, which drops the statements pg_wire prepared too.
        conn.prepare_threshold = None
        # The bound on waiting for a lock another transaction holds (StoreBusyError after).
        conn.execute(f"SET lock_timeout = {_lock_timeout_ms(self.write_timeout)}")
        conn.execute(CUSTOM_PLANS)
        conn.execute(DURABLE_COMMITS)
        set_json_loads(orjson.loads, conn)
        set_json_dumps(orjson.dumps, conn)

    def migrate(self) -> tuple[str, str]:
        """Create the schema when missing and run the migrations it has not seen, each in
        its own transaction, under an advisory lock (replicas starting together migrate
        once; the others wait, then find nothing left to do). Returns the schema and the
        event notification channel."""
        conn = self._connect()
        try:
            search_path = conn.execute("SHOW search_path").fetchone()
            schema = conn.execute("SELECT current_schema()").fetchone()
            name = schema[0] if schema and schema[0] else first_schema(search_path[0] if search_path else "")
            if not name:
                raise ValueError(f"{redacted(self.url)}: the search_path names no schema to keep tables in")
            key = int.from_bytes(
                hashlib.sha256(f"cleveragents-acp:{name}".encode()).digest()[:8], "big", signed=True
            )
            conn.execute(f"SET lock_timeout = {round(MIGRATION_WAIT * 1000)}")
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
            try:
                conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(name)))
                conn.execute(
                    sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {}.acp_schema "
                        "(one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one), version INTEGER NOT NULL)"
                    ).format(sql.Identifier(name))
                )
                for version, script in enumerate(PG_MIGRATIONS, start=1):
                    if version <= self._version(conn, name):
                        continue
                    with conn.transaction():
                        conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(sql.Identifier(name)))
                        conn.execute(cast(Any, script))
                        conn.execute(
                            "INSERT INTO acp_schema (one, version) VALUES (TRUE, %s) "
                            "ON CONFLICT (one) DO UPDATE SET version = excluded.version",
                            (version,),
                        )
                self._version(conn, name)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        finally:
            conn.close()
        channel = "acp_events_" + hashlib.sha256(name.encode()).hexdigest()[:16]
        return name, channel

    def _version(self, conn: psycopg.Connection[Any], schema: str) -> int:
        row = conn.execute(
            sql.SQL("SELECT version FROM {}.acp_schema").format(sql.Identifier(schema))
        ).fetchone()
        version = int(row[0]) if row else 0
        if version > len(PG_MIGRATIONS):
            raise SchemaTooNewError(
                f"schema {schema} of {redacted(self.url)} is at schema version {version}; "
                f"this release knows versions up to {len(PG_MIGRATIONS)}"
            )
        return version

    @property
    def schema_version(self) -> int:
        row = self._one("SELECT version FROM acp_schema")
        return int(row[0]) if row else 0

    # the event loop's interface --------------------------------------------------------

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
            mapped = _store_error(exc, queued)
            if mapped is None:
                raise
            raise mapped from None

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

    # reads on the loop's own connections ----------------------------------------------

    async def read_get(self, kind: str, id: str) -> Record | None:
        answers = await self._loop_read([(_GET, (kind, id))])
        if answers is PSYCOPG:
            return await super().read_get(kind, id)
        (found,) = answers
        return _record(found[0]) if found else None

    async def read_get_by_name(self, kind: str, namespace: str, name: str) -> Record | None:
        answers = await self._loop_read([(_BY_NAME, (kind, namespace, name))])
        if answers is PSYCOPG:
            return await super().read_get_by_name(kind, namespace, name)
        (found,) = answers
        return _record(found[0]) if found else None

    async def read_with_items(
        self, kind: str, id: str, collection: str
    ) -> tuple[Record | None, list[tuple[int, bytes]]]:
        answers = await self._loop_read([(_GET, (kind, id)), (_ITEMS, (collection, id))])
        if answers is PSYCOPG:
            return await super().read_with_items(kind, id, collection)
        records, items = answers
        return (_record(records[0]) if records else None), rows.items(items)

    async def read_query(self, query: ListQuery) -> list[Record]:
        statement = _query_statement(query)
        if statement is None:
            return []
        answers = await self._loop_read([statement])
        if answers is PSYCOPG:
            return await super().read_query(query)
        (found,) = answers
        return [_record(row) for row in found]

    async def read_items(self, collection: str, owner_id: str) -> list[tuple[int, bytes]]:
        answers = await self._loop_read([(_ITEMS, (collection, owner_id))])
        if answers is PSYCOPG:
            return await super().read_items(collection, owner_id)
        (found,) = answers
        return rows.items(found)

    async def _loop_read(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[Rows] | Fallback:
        """The statements' rows in one snapshot, on this loop's own connections; errors
        as the same statements give in ``read``."""
        if self._closing:
            raise RuntimeError("the store is closed")
        loop = asyncio.get_running_loop()
        reads = self._loops.get(loop)
        if reads is None:
            reads = self._loop_reads(loop)
        started = time.monotonic()
        try:
            return await reads.run(statements)
        except Exception as exc:
            mapped = _store_error(exc, started)
            if mapped is None:
                raise
            raise mapped from None

    # a write on the loop's own connections ---------------------------------------------

    async def insert_alone(self, record: Record) -> None:
        """One INSERT committed on this loop's write connections (pg_loop.py), with the
        others queued meanwhile; under a request id (its row is written in the same
        transaction) through the writer threads."""
        claim = CLAIM.get()
        if self._closing:
            raise RuntimeError("the store is closed")
        if claim is not None and claim.open:
            await super().insert_alone(record)
            return
        loop = asyncio.get_running_loop()
        writes = self._loop_writes.get(loop)
        if writes is None:
            writes = self._loop_writes_of(loop)
        started = time.monotonic()
        try:
            written = await writes.write(_INSERT, _insert_params(record))
        except Exception as exc:
            mapped = _store_error(exc, started)
            if mapped is None:
                raise
            raise mapped from None
        if written is PSYCOPG:
            await super().insert_alone(record)
            return
        observer = self.observer
        if observer is not None:
            observer.waited("write", 0.0)
            observer.committed(time.monotonic() - started)
        if not written:
            raise _clash(record)

    def _loop_reads(self, loop: asyncio.AbstractEventLoop) -> LoopReads:
        """This loop's reads, made on its first; those of loops closed meanwhile let go."""
        with self._loops_lock:
            _let_go_of_closed(self._loops)
            reads = self._loops[loop] = LoopReads(
                loop, self._conninfo, CONNECT_TIMEOUT, self._loop_connections
            )
            return reads

    def _loop_writes_of(self, loop: asyncio.AbstractEventLoop) -> LoopWrites:
        """This loop's writes, made on its first; those of loops closed meanwhile let go."""
        with self._loops_lock:
            _let_go_of_closed(self._loop_writes)
            writes = self._loop_writes[loop] = LoopWrites(
                loop, self._conninfo, CONNECT_TIMEOUT, self._loop_connections, self._write_setup
            )
            return writes

    def _close_loop_reads(self) -> None:
        """Fail the loop reads and writes still waiting and close their connections, each on
        its own loop's thread (or here, where that loop is closed, stopped, or this one)."""
        with self._loops_lock:
            lanes = [*self._loops.items(), *self._loop_writes.items()]
            self._loops, self._loop_writes = {}, {}
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        why = RuntimeError("the store is closed")
        for loop, reads in lanes:
            if loop.is_running() and not loop.is_closed() and loop is not here:
                closed = threading.Event()

                def close_there(reads: LoopReads = reads, closed: threading.Event = closed) -> None:
                    try:
                        reads.close(why)
                    finally:
                        closed.set()

                try:
                    loop.call_soon_threadsafe(close_there)
                except RuntimeError:  # closed meanwhile
                    reads.close(why)
                else:
                    closed.wait(CONNECT_TIMEOUT)
            else:
                reads.close(why)

    async def aclose(self) -> None:
        """Let the reads and writes under way on this loop finish, then close."""
        self._closing = True
        loop = asyncio.get_running_loop()
        for lane in (self._loops.get(loop), self._loop_writes.get(loop)):
            if lane is not None:
                await lane.drain()
        await asyncio.to_thread(self.close)

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
            mapped = _store_error(exc, job.queued)
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
            except _BUSY:
                raise StoreBusyError(time.monotonic() - started) from None
            self._order.due(jobs)

    def _starved(self, waited: float) -> ACPError:
        """No pooled connection came within the bound: every one in use (STORE_BUSY), or
        none can be made, the database being down (STORE_UNAVAILABLE; one connection
        attempt tells, on this store thread)."""
        try:
            psycopg.connect(self.url, autocommit=True, connect_timeout=_STARVED_CONNECT_TIMEOUT).close()
        except psycopg.OperationalError as exc:
            return StoreDownError(_first_line(exc))
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
                here.write_began = conn.info.transaction_status in _IN_TRANSACTION
        if here.read is not None:
            if here.began:
                return self._on(here.read, statement, params, fetch)
            try:
                return self._on(here.read, statement, params, fetch, _BEGIN_READ)
            finally:
                # Begun unless it failed before anything was sent.
                here.began = here.read.info.transaction_status in _IN_TRANSACTION
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
            mapped = _store_error(exc, started)
            if mapped is None:
                raise
            raise mapped from None

    def _one(self, statement: Any, params: Sequence[Any] | Mapping[str, Any] = ()) -> Any:
        return self._run(statement, params, "one")

    def _all(self, statement: Any, params: Sequence[Any] | Mapping[str, Any] = ()) -> list[Any]:
        return cast(list[Any], self._run(statement, params, "all"))

    def _count(self, statement: Any, params: Sequence[Any] | Mapping[str, Any] = ()) -> int:
        return int(self._run(statement, params, "count"))

    def _list_statement(self, query: ListQuery) -> tuple[str, list[Any]] | None:
        """One page: newest first (or by name), filters as indexed conditions; PostgreSQL's
        planner walks the (kind, id) or (kind, namespace, id) index and stops at the page,
        or reads a filter's GIN matches when they are few."""
        return _query_statement(query)

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

    def insert(self, record: Record) -> None:
        with self.transaction():
            if not self._count(_INSERT, _insert_params(record)):
                raise _clash(record)
            self.note_claim(record.kind, record.id, record.body)

    def update(self, record: Record, expected_revision: int | None = None) -> None:
        # One conditional UPDATE: it locks the row and checks the revision it finds then.
        with self.transaction():
            changed = self._count(
                "UPDATE records SET namespace=%s, name=%s, revision=%s, state=%s, attrs=%s, labels=%s, "
                "update_time=%s, body=%s WHERE kind=%s AND id=%s AND (%s::bigint IS NULL OR revision=%s)",
                (*rows.update_params(record, Jsonb), expected_revision, expected_revision),
            )
            if not changed:
                current = self._one(
                    "SELECT revision FROM records WHERE kind=%s AND id=%s", (record.kind, record.id)
                )
                if current is None:
                    raise KeyError(f"{record.kind} {record.id}")
                raise StaleRevisionError(int(current[0]))
            self.note_claim(record.kind, record.id, record.body)

    def delete(self, kind: str, id: str, expected_revision: int | None = None) -> bool:
        with self.transaction():
            removed = self._one(
                "DELETE FROM records WHERE kind=%s AND id=%s AND (%s::bigint IS NULL OR revision=%s) "
                "RETURNING body",
                (kind, id, expected_revision, expected_revision),
            )
            if removed:
                self.note_claim(kind, id, bytes(removed[0]))
                return True
            if expected_revision is None:
                return False
            current = self._one("SELECT revision FROM records WHERE kind=%s AND id=%s", (kind, id))
            if current is None:
                return False
            raise StaleRevisionError(int(current[0]))

    # items ----------------------------------------------------------------------------

    def append_items(self, collection: str, owner_id: str, bodies: Sequence[bytes]) -> list[int]:
        with self.transaction():
            # One appender per owner at a time, across replicas: indices stay 0..n-1.
            self._one(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                (f"items:{len(collection)}:{collection}:{owner_id}",),
            )
            row = self._one(
                "SELECT COALESCE(MAX(idx), -1) FROM items WHERE collection=%s AND owner_id=%s",
                (collection, owner_id),
            )
            start = int(row[0]) + 1
            indices = list(range(start, start + len(bodies)))
            if bodies:
                self._count(
                    "INSERT INTO items (collection, owner_id, idx, body) "
                    "SELECT %s, %s, i, b FROM unnest(%s::bigint[], %s::bytea[]) AS u(i, b)",
                    (collection, owner_id, indices, list(bodies)),
                )
            self.note_claim()
            return indices

    def put_items(self, collection: str, owner_id: str, items: Mapping[int, bytes]) -> None:
        if not items:
            return
        with self.transaction():
            self._count(
                "INSERT INTO items (collection, owner_id, idx, body) "
                "SELECT %s, %s, i, b FROM unnest(%s::bigint[], %s::bytea[]) AS u(i, b) "
                "ON CONFLICT (collection, owner_id, idx) DO UPDATE SET body = excluded.body",
                (collection, owner_id, list(items), list(items.values())),
            )
            self.note_claim()

    def get_with_items(
        self, kind: str, id: str, collection: str
    ) -> tuple[Record | None, list[tuple[int, bytes]]]:
        here = self._thread
        conn = here.read
        if conn is None or here.began or here.depth:
            return super().get_with_items(kind, id, collection)
        # A read's first statements: both go with its BEGIN, in one round trip.
        started = time.monotonic()
        try:
            answers = self._wire.run_all(
                conn,
                [
                    (_GET, (kind, id)),
                    (_ITEMS, (collection, id)),
                ],
                _BEGIN_READ,
            )
        except Exception as exc:
            mapped = _store_error(exc, started)
            if mapped is None:
                raise
            raise mapped from None
        finally:
            # Begun unless it failed before anything was sent.
            here.began = conn.info.transaction_status in _IN_TRANSACTION
        if answers is PSYCOPG:
            return super().get_with_items(kind, id, collection)
        records, items = answers
        return (_record(records[0]) if records else None), rows.items(items)

    def delete_items(self, collection: str, owner_id: str) -> None:
        self._count("DELETE FROM items WHERE collection=%s AND owner_id=%s", (collection, owner_id))

    # events ---------------------------------------------------------------------------

    def append_events(self, events: Sequence[StoredEvent]) -> list[int]:
        """One statement: take ``len(events)`` sequences from the counter (its row stays
        locked until this transaction ends, so the next appender, on any replica, waits
        and continues after them, or from here again if this one rolls back), insert the
        events, and notify the channel, which listeners hear only once this commits."""
        if not events:
            return []
        with self.transaction():
            row = self._one(
                "WITH counter AS (UPDATE event_sequence SET last = last + %(n)s RETURNING last), "
                "added AS (INSERT INTO events (sequence, namespace, type, plan_id, session_id, time, body) "
                "SELECT (SELECT last FROM counter) - %(n)s + u.o, u.ns, u.ty, u.pl, u.se, u.ti, u.bo "
                "FROM unnest(%(ns)s::text[], %(ty)s::text[], %(pl)s::text[], %(se)s::text[], "
                "%(ti)s::float8[], %(bo)s::bytea[]) WITH ORDINALITY AS u(ns, ty, pl, se, ti, bo, o)) "
                "SELECT last, pg_notify(%(channel)s, last::text) FROM counter",
                {
                    "n": len(events),
                    "ns": [e.namespace for e in events],
                    "ty": [e.type for e in events],
                    "pl": [e.plan_id for e in events],
                    "se": [e.session_id for e in events],
                    "ti": [e.time for e in events],
                    "bo": [e.body for e in events],
                    "channel": self.channel,
                },
            )
            self._thread.appended = True
            last = int(row[0])
            self.note_claim()
            return list(range(last - len(events) + 1, last + 1))

    def read_events(
        self, after_sequence: int, limit: int, where: EventFilter | None = None
    ) -> list[StoredEvent]:
        return [_event(row) for row in self._events(_EVENT_COLUMNS, after_sequence, limit, where)]

    def read_event_bodies(
        self, after_sequence: int, limit: int, where: EventFilter | None = None
    ) -> list[tuple[int, bytes]]:
        # Two columns: a backlog decodes only these, and each column is a Python object a row.
        return [
            (int(row[0]), bytes(row[1]))
            for row in self._events("sequence, body", after_sequence, limit, where)
        ]

    def last_sequence(self) -> int:
        row = self._one("SELECT last FROM event_sequence")
        return int(row[0]) if row else 0

    # leases ---------------------------------------------------------------------------

    def _fenced_lease(self, name: str, token: int | None) -> Lease | None:
        """FOR SHARE: a claim (an UPDATE of the row) waits until the guarded transaction
        ends, so the writes it guards commit before any new holder's token exists. Checking
        a lease nobody ever held makes its row, so there is a row to lock."""
        if token is None:
            self._count(_SQL.make_lease, (name,))
        row = self._one(_SQL.get_lease + " FOR SHARE", (name,))
        return rows.lease(row) if row else None

    def event_wakeups(self) -> EventWakeups:
        """LISTEN on a connection of its own: woken when an append commits on any replica."""
        return PostgresWakeups(self.url, self.channel, self._conninfo)

    def close(self) -> None:
        """Finish the calls under way, stop the threads, close every connection."""
        if self._closed:
            return
        self._closing = True
        self._close_loop_reads()
        self._writers.shutdown(wait=True)
        self._reads.close()
        self._order.drain()
        self._closed = True
        with self._pinned_lock:
            pinned, self._pinned = self._pinned, set()
        for conn in pinned:
            try:
                self._wire.settle(conn)
            except psycopg.Error as exc:
                log.warning("a read's COMMIT was lost at close: %s", exc)
            self._pool.putconn(conn)
        self._pool.close()


def _let_go_of_closed(lanes: dict[asyncio.AbstractEventLoop, Any]) -> None:
    """Close and forget the loop connections of event loops closed since."""
    for loop, lane in list(lanes.items()):
        if loop.is_closed():
            del lanes[loop]
            lane.close(RuntimeError("the event loop is closed"))


class PostgresWakeups(EventWakeups):
    """LISTEN on a connection of its own, used by the follower's thread alone. A hint, never
    the truth: a notification lost with a dropped connection is covered by the follower's
    poll, and the connection is made again at the next wait."""

    # How long one look at the connection blocks, so a close is noticed soon.
    SLICE = 0.2

    def __init__(self, url: str, channel: str, conninfo: str | None = None) -> None:
        super().__init__()
        self._url = url
        self._conninfo = url if conninfo is None else conninfo
        self._channel = channel
        self._conn: psycopg.Connection[Any] | None = None
        # Held while the connection is in use: close() releases it only between waits.
        self._using = threading.Lock()

    def _listening(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT)
            self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        return self._conn

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._using:
            while not self._closed.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                try:
                    conn = self._listening()
                    for _ in conn.notifies(timeout=min(self.SLICE, remaining), stop_after=1):
                        return True
                except psycopg.Error as exc:
                    log.warning(
                        "event wake-ups from %s lost (%s); polling until back", redacted(self._url), exc
                    )
                    self._drop()
                    self._closed.wait(min(remaining, 1.0))
            self._drop()
        return False

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            conn.close()

    def close(self) -> None:
        super().close()
        # A wait in progress sees the flag within SLICE and drops the connection itself.
        if self._using.acquire(timeout=self.SLICE * 10):
            try:
                self._drop()
            finally:
                self._using.release()
