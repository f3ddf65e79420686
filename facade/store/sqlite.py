"""The embedded default store: one SQLite file in WAL mode.

``synchronous=FULL``: a commit returns only after the WAL is on disk, so an acknowledged
write survives a ``kill -9`` and a power cut alike.

One writer thread owns the write connection: ``write`` queues a function, and the writer
runs every function queued while its previous commit ran (each in a savepoint, so one
failing undoes only its own writes) and commits them as one (group commit: one fsync for
many calls). A write asked for while the writer sleeps wakes it once its event loop has
run what is ready (at most ``HOLD`` later): the writes of that turn of the loop go in one
commit. Readers use their own connections on a small thread pool; in WAL mode a read never
waits for the write lock, whoever holds it. A write lock held by another process
(the ``agents`` CLI on the same file, a backup, an ``sqlite3`` shell) is waited for on the
writer thread, in short slices, up to ``write_timeout``: then the waiting calls fail with
StoreBusyError and nothing of them was written.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import functools
import itertools
import json
import logging
import os
import pathlib
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar, cast

import orjson

from cleveragents.acp.facade.store import rows
from cleveragents.acp.facade.store import sqlite_lists as lists
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
    StoreFullError,
)
from cleveragents.acp.facade.store.delivery import CommitOrder, Job, current_task, done, run_callback
from cleveragents.acp.facade.store.migrations import MIGRATIONS
from cleveragents.acp.facade.store.read_cache import ReadCache
from cleveragents.acp.facade.store.reads import Outcome, ReadLane
from cleveragents.acp.facade.store.requests import RequestEntry
from cleveragents.acp.facade.store.sql_store import SQLStore
from cleveragents.acp.facade.store.statements import SQLITE, Statements
from cleveragents.acp.facade.store.wakeups import DEFAULT_WAKEUP_TICK, DataVersionWakeups, PeerChannel
from cleveragents.acp.facade.store.wal_index import WalIndex

log = logging.getLogger(__name__)

_EVENT_COLUMNS = "sequence, namespace, type, plan_id, session_id, time, body"
T = TypeVar("T")

# Times as text of 17 significant digits: a REAL in JSON keeps only 15.
_POINT_RECORD = (
    "json_array(r.kind, r.id, r.namespace, r.name, r.revision, r.state, r.attrs, r.labels, "
    "printf('%!.17g', r.create_time), printf('%!.17g', r.update_time), hex(r.body))"
)


@functools.cache
def _points_statement(records: int, owners: int) -> str:
    """The records of ``records`` (kind, id) pairs and the items of ``owners`` (collection,
    owner_id) pairs, each as a JSON array; both looked up by primary key."""
    keys = ",".join(["(?,?)"] * records)
    found = (
        f"SELECT json_group_array({_POINT_RECORD}) FROM (VALUES {keys}) AS k "
        "CROSS JOIN records AS r ON r.kind = k.column1 AND r.id = k.column2"
    )
    if not owners:
        return f"SELECT ({found}), '[]'"
    pairs = ",".join(["(?,?)"] * owners)
    listed = (
        "SELECT json_group_array(json_array(i.collection, i.owner_id, i.idx, hex(i.body))) "
        f"FROM (VALUES {pairs}) AS k "
        "CROSS JOIN items AS i ON i.collection = k.column1 AND i.owner_id = k.column2"
    )
    return f"SELECT ({found}), ({listed})"


def _first(item: tuple[int, bytes]) -> int:
    return item[0]


# A point read's answer: the record (None: there is none) and its items, if any were asked.
_Answer = tuple[Record | None, list[tuple[int, bytes]]]
# What a kept answer costs beside its bodies (the objects around them), roughly.
_KEPT_OVERHEAD = 300


def _copied(answer: _Answer) -> _Answer:
    """An answer no caller of ``read_cache`` shares with another: a Record and its dicts
    may be changed by whoever got them (bodies and item tuples are immutable)."""
    record, items = answer
    if record is not None:
        # The constructor, not copy.copy: a third of the cost, on every answer from memory.
        record = Record(
            kind=record.kind,
            id=record.id,
            namespace=record.namespace,
            body=record.body,
            name=record.name,
            revision=record.revision,
            state=record.state,
            attrs=dict(record.attrs),
            labels=dict(record.labels),
            create_time=record.create_time,
            update_time=record.update_time,
        )
    return record, list(items)


def _size(answer: _Answer) -> int:
    record, items = answer
    size = _KEPT_OVERHEAD + (len(record.body) if record is not None else 0)
    return size + sum(len(body) + 64 for _, body in items)


class _PointRead:
    """A read of one record, and of its items in ``collection`` when one is named, by
    primary key: the reader answers those it takes at once together (``ReadLane``)."""

    __slots__ = ("collection", "id", "kind", "queued", "together")

    def __init__(
        self,
        together: Callable[[list[_PointRead]], list[Outcome]],
        kind: str,
        id: str,
        collection: str | None,
        queued: float,
    ) -> None:
        self.together = together
        self.kind = kind
        self.id = id
        self.collection = collection
        self.queued = queued

    def answer(
        self,
        records: Mapping[tuple[str, str], Record],
        items: Mapping[tuple[str, str], list[tuple[int, bytes]]],
    ) -> tuple[Record | None, list[tuple[int, bytes]]]:
        """Its answer from what one statement found for it and the others."""
        if self.collection is None:
            return records.get((self.kind, self.id)), []
        return records.get((self.kind, self.id)), items.get((self.collection, self.id), [])

    def __call__(self) -> tuple[Record | None, list[tuple[int, bytes]]]:
        error, result = self.together([self])[0]
        if error is not None:
            raise error
        return cast(tuple[Record | None, list[tuple[int, bytes]]], result)


_WITH_ITEMS = (
    f"SELECT NULL, {rows.COLUMNS} FROM records WHERE kind=? AND id=? "
    "UNION ALL SELECT idx, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, body "
    "FROM items WHERE collection=? AND owner_id=? ORDER BY 1"
)


_INSERT_RECORDS = f"INSERT INTO records ({rows.COLUMNS}) VALUES "


class _Insert:
    """``insert(record)`` with nothing read before it (``insert_alone``): the writer makes
    those of a batch that follow one another together (``SQLiteStore._insert_together``)."""

    __slots__ = ("record",)

    def __init__(self, record: Record) -> None:
        self.record = record

    def __call__(self, store: Store) -> None:
        store.insert(self.record)


def _is_insert(job: Job) -> bool:
    return type(job.fn) is _Insert


def _statements(script: str) -> Iterator[str]:
    """Split a migration into statements; a ``;`` inside a trigger body or a string does
    not end one (``executescript`` would, but it commits on its own)."""
    pending = ""
    for piece in script.split(";"):
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \t\r\n;"):
                yield pending
            pending = ""
    if pending.strip(" \t\r\n;"):
        yield pending


_STR = frozenset({str})


def _loads(text: str) -> Any:
    """json.loads, by orjson for the flat string maps attrs and labels are (a tenth of the
    time: every record read pays it twice). For those the two agree; anything else (and
    what orjson refuses: NaN, lone surrogates) is json's to read, so numbers stay exact."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)
    if type(value) is dict and set(map(type, value.values())) <= _STR:
        return value
    return json.loads(text)


def _json(value: dict[str, str]) -> str:
    """Compact, keys sorted; by orjson (a twentieth of json.dumps' time: every record
    written pays it twice), by json for what orjson refuses (a lone surrogate)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError:
        return json.dumps(value, sort_keys=True, separators=(",", ":"))


# The most writes one commit takes: bounds how long the first of them waits for the last.
MAX_BATCH = 256
# How long a write asked for while the writer sleeps waits at most for its busy loop to
# run out of ready callbacks before the writer is woken.
HOLD = 0.0005
# How long one attempt at the write lock blocks the writer thread before it looks again.
_LOCK_SLICE_MS = 50


# How often a store opening a file another process is creating tries WAL mode again.
_WAL_RETRY_SECONDS = 0.01


# SQLite's primary result code for a full disk (ENOSPC on the database, journal or WAL).
_SQLITE_FULL = 13


def _disk_full(exc: BaseException) -> bool:
    return (
        isinstance(exc, sqlite3.Error) and (getattr(exc, "sqlite_errorcode", 0) or 0) & 0xFF == _SQLITE_FULL
    )


def _busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc)
    return "locked" in text or "busy" in text


_SWEEP_FIRST = "SELECT principal, request_id, time FROM requests ORDER BY principal, request_id LIMIT ?"
_SWEEP_AFTER = (
    "SELECT principal, request_id, time FROM requests WHERE (principal, request_id) > (?, ?) "
    "ORDER BY principal, request_id LIMIT ?"
)


def _create_private(path: pathlib.Path) -> None:
    """A new database file readable by the server's user alone (a contained command running
    as another user must not read sessions or plans); SQLite gives -wal and -shm the file's
    own mode. Only a file this call creates is opened and closed here: closing a descriptor
    of a file drops every POSIX lock the process holds on it, SQLite's included."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    os.close(fd)


class SQLiteStore(SQLStore):
    sql = Statements(SQLITE)
    read_maps = staticmethod(_loads)

    def __init__(
        self,
        path: str | pathlib.Path,
        *,
        synchronous: str = "FULL",
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
        readers: int = 2,
        wakeup_tick: float = DEFAULT_WAKEUP_TICK,
        peers: PeerChannel | None = None,
        cache_reads: bool = True,
    ) -> None:
        """``wakeup_tick``: how often an event follower looks at the file's data_version;
        ``peers``: the other workers of this server, told at once of each commit that
        appended events (``wakeups.PeerChannel``); ``cache_reads``: answer point and
        by-name reads again from memory while nobody commits (``read_cache.py``)."""
        self.path = pathlib.Path(path)
        if str(path) == ":memory:":
            raise ValueError("SQLiteStore needs a file: its readers open their own connections")
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        _create_private(self.path)
        self.write_timeout = write_timeout
        self.wakeup_tick = wakeup_tick
        self.peers = peers
        # Set by append_events in a write transaction: tell the peers once it commits.
        self._appended = False
        # The write connection: the writer thread's, or a blocking caller's under this lock.
        self._lock = threading.RLock()
        self._depth = 0
        self._owner_thread: int | None = None
        self._owner: asyncio.Task[Any] | None = None
        self._after_commit: list[Callable[[], None]] = []
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        wal = self._wal_mode()
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.execute("PRAGMA foreign_keys=ON")
        # Savepoints' and statements' rollback journals in memory, not in temporary files:
        # each write (a savepoint of a group commit) cost about 21 pwrite calls there, three
        # times what its WAL frames cost. They only ever undo part of an open transaction,
        # so a crash needs none of them: the WAL alone is what survives it.
        self._db.execute("PRAGMA temp_store=MEMORY")
        self._db.execute(f"PRAGMA busy_timeout={_LOCK_SLICE_MS}")
        try:
            self.migrate()
        except BaseException:
            self._db.close()
            raise
        # Read connections, one per thread that reads (reader pool, or a blocking caller).
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._reads = ReadLane(readers, "acp-store-read")
        # Point and by-name reads answered on the loop while nobody commits (read_cache.py).
        # Only in WAL mode: a -shm file left by an earlier WAL session would never change.
        self._index = WalIndex(self.path) if wal and cache_reads else None
        self._cache: ReadCache[_Answer] | None = ReadCache(self._index) if self._index else None
        # The one event loop that uses the cache (it has no lock): another one's reads go
        # to the readers, until the first is closed.
        self._cache_loop: asyncio.AbstractEventLoop | None = None
        # Writes queued for the writer thread, started on the first write().
        self._queue: collections.deque[Job] = collections.deque()
        self._wake = threading.Condition()
        self._writer: threading.Thread | None = None
        # The writer waits for work and nobody woke it yet (under ``_wake``); the loops
        # whose wake-up of it is held until they run out of ready callbacks.
        self._sleeping = False
        self._holding: set[asyncio.AbstractEventLoop] = set()
        self._closing = False
        self._closed = False
        # Committed writes whose callbacks and answers are due, in commit order.
        self._order = CommitOrder()

    def _wal_mode(self) -> bool:
        """Switch the file to WAL; whether it is in WAL mode. Processes opening one new file
        together (workers, a CLI beside a server) each need its exclusive lock for that, and
        SQLite answers "database is locked" at once, without its busy handler, to one that
        finds another's write transaction open: it tries again until the write bound."""
        deadline = time.monotonic() + self.write_timeout
        while True:
            try:
                return bool(self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal")
            except sqlite3.OperationalError as exc:
                if not _busy(exc) or time.monotonic() >= deadline:
                    self._db.close()
                    raise
            time.sleep(_WAL_RETRY_SECONDS)

    # schema ---------------------------------------------------------------------------

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def migrate(self) -> None:
        """Run, each in its own transaction, the migrations this file has not seen.

        The version is read again under the write lock, so two processes opening one new
        file do not both run a step."""
        with self._lock:
            for version, script in enumerate(MIGRATIONS, start=1):
                if version <= self._check_version():
                    continue
                self._begin(time.monotonic() + self.write_timeout)
                try:
                    if version <= self._check_version():
                        self._db.execute("ROLLBACK")
                        continue
                    for statement in _statements(script):
                        self._db.execute(statement)
                    self._db.execute(f"PRAGMA user_version={version}")
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            self._check_version()

    def _check_version(self) -> int:
        version = self.schema_version
        if version > len(MIGRATIONS):
            raise SchemaTooNewError(
                f"{self.path} is at schema version {version}; "
                f"this release knows versions up to {len(MIGRATIONS)}"
            )
        return version

    def _begin(self, deadline: float) -> None:
        """BEGIN IMMEDIATE, waiting in slices for a lock another process holds."""
        started = time.monotonic()
        while True:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if not _busy(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise StoreBusyError(time.monotonic() - started) from None

    # the event loop's interface --------------------------------------------------------

    async def read(self, fn: Callable[[Store], T], *, urgent: bool = False) -> T:
        return await self._read(fn, urgent=urgent)

    # One statement each, which is its own snapshot: no BEGIN and COMMIT around it. The
    # sqlite3 module lets go of the GIL at each statement's start and end and twice per row,
    # and the busy event loop takes it each time: the reader thread then sleeps until it gets
    # it back (a loop thread busy meanwhile: 111 µs of reader CPU for a read of 4
    # statements against 27 µs for one).
    # Reads by primary key the reader takes at once go in one statement (``_read_points``).

    async def read_get(self, kind: str, id: str) -> Record | None:
        record, _ = await self._read_point(kind, id, None)
        return record

    async def read_with_items(
        self, kind: str, id: str, collection: str
    ) -> tuple[Record | None, list[tuple[int, bytes]]]:
        return await self._read_point(kind, id, collection)

    async def _read_point(
        self, kind: str, id: str, collection: str | None
    ) -> tuple[Record | None, list[tuple[int, bytes]]]:
        async def read() -> _Answer:
            point = _PointRead(self._read_points, kind, id, collection, time.monotonic())
            return cast(_Answer, await self._reads.run(point))

        return await self._cached((kind, id, collection), read)

    async def _cached(self, key: tuple[str | None, ...], read: Callable[[], Awaitable[_Answer]]) -> _Answer:
        """``read()``'s answer, or the one kept for ``key`` if nobody committed since."""
        if self._closed:
            raise RuntimeError("the store is closed")
        cache = self._cache_here()
        if cache is None:
            return await read()
        state = cache.look()
        found, kept = cache.get(state, key)
        if found:
            return _copied(cast(_Answer, kept))
        answer = await read()
        cache.put(state, key, _copied(answer), _size(answer))
        return answer

    def read_cache_counts(self) -> tuple[int, int]:
        cache = self._cache
        return (cache.hits, cache.misses) if cache is not None else (0, 0)

    def _cache_here(self) -> ReadCache[_Answer] | None:
        """The read cache, if this loop is the one using it."""
        if self._cache is None:
            return None
        loop = asyncio.get_running_loop()
        owner = self._cache_loop
        if owner is loop:
            return self._cache
        if owner is not None and not owner.is_closed():
            return None
        with self._readers_lock:
            if self._cache_loop is not owner:
                return None
            self._cache.clear()
            self._cache_loop = loop
        return self._cache

    async def read_get_by_name(self, kind: str, namespace: str, name: str) -> Record | None:
        def get(store: Store) -> Record | None:
            return store.get_by_name(kind, namespace, name)

        async def read() -> _Answer:
            return await self._read(get, transaction=False), []

        record, _ = await self._cached(("by-name", kind, namespace, name), read)
        return record

    async def read_items(self, collection: str, owner_id: str) -> list[tuple[int, bytes]]:
        return await self._read(lambda store: store.list_items(collection, owner_id), transaction=False)

    async def _read(self, fn: Callable[[Store], T], *, urgent: bool = False, transaction: bool = True) -> T:
        """``transaction``: ``fn`` makes more than one statement, which must see one snapshot."""
        if self._closed:
            raise RuntimeError("the store is closed")
        # The caller's context travels with fn (its trace, read by what fn records).
        context = contextvars.copy_context()
        queued = time.monotonic()
        return await self._reads.run(
            functools.partial(context.run, self._read_now, fn, queued, transaction), urgent=urgent
        )

    def _read_now(self, fn: Callable[[Store], T], queued: float, transaction: bool) -> T:
        observer = self.observer
        if observer is not None:
            observer.waited("read", time.monotonic() - queued)
        if not transaction:
            return fn(self)
        db = self._reader()
        db.execute("BEGIN")
        try:
            return fn(self)
        finally:
            db.execute("COMMIT")

    def _read_points(self, reads: list[_PointRead]) -> list[Outcome]:
        """On a reader thread: the records (and items) of ``reads``, in one statement. If it
        fails (one answer over SQLite's length limit, SQLITE_TOOBIG, though each fits
        alone; or a fault), each read is made alone and meets its own fault, if any."""
        observer = self.observer
        if observer is not None:
            now = time.monotonic()
            for read in reads:
                observer.waited("read", now - read.queued)
        if len(reads) > 1:
            try:
                records, items = self._points(reads)
            except sqlite3.Error:
                log.debug("point reads made one by one after their statement failed", exc_info=True)
            else:
                return [(None, read.answer(records, items)) for read in reads]
        return [self._read_point_alone(read) for read in reads]

    def _read_point_alone(self, read: _PointRead) -> Outcome:
        try:
            if read.collection is None:
                return None, (self.get(read.kind, read.id), [])
            return None, self.get_with_items(read.kind, read.id, read.collection)
        except Exception as exc:  # handed to the caller
            return exc, None

    def _points(
        self, reads: list[_PointRead]
    ) -> tuple[dict[tuple[str, str], Record], dict[tuple[str, str], list[tuple[int, bytes]]]]:
        """One row whatever the number of reads and items: each row costs the reader two
        more hand-offs of the GIL (``_read_point``), so the rows come as two JSON arrays."""
        keys = list(dict.fromkeys((read.kind, read.id) for read in reads))
        owners = list(
            dict.fromkeys((read.collection, read.id) for read in reads if read.collection is not None)
        )
        params = [value for key in keys + owners for value in key]
        found, listed = self._one(_points_statement(len(keys), len(owners)), params)
        records: dict[tuple[str, str], Record] = {}
        for row in orjson.loads(found):
            # The times and the body as _POINT_RECORD wrote them: text, and hex.
            row[8:] = float(row[8]), float(row[9]), bytes.fromhex(row[10])
            point = rows.record(row, _loads)
            records[point.kind, point.id] = point
        items: dict[tuple[str, str], list[tuple[int, bytes]]] = {}
        for collection, owner_id, idx, body in orjson.loads(listed):
            items.setdefault((collection, owner_id), []).append((idx, bytes.fromhex(body)))
        for owned in items.values():
            owned.sort(key=_first)
        return records, items

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

    def free_bytes(self) -> int | None:
        """Free bytes on the file system of the database (where its WAL grows)."""
        try:
            stat = os.statvfs(self.path.parent)
        except OSError:
            return None
        return stat.f_bavail * stat.f_frsize

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
                if not _busy(exc):
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

    # connections ----------------------------------------------------------------------

    def _reader(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            if self._closed:
                raise RuntimeError("the store is closed")
            db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA query_only=ON")
            db.execute("PRAGMA busy_timeout=5000")
            with self._readers_lock:
                self._readers.append(db)
            self._local.db = db
        return db

    def _conn(self) -> sqlite3.Connection:
        """The write connection on the thread in a write transaction, else a reader."""
        if self._depth and self._owner_thread == threading.get_ident():
            self._check_owner()
            return self._db
        return self._reader()

    # transactions ---------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One writer at a time (a lock, and BEGIN IMMEDIATE across processes).

        Inside ``write`` (on the writer thread) it joins the call's transaction. Elsewhere
        it blocks its thread for the write lock. A transaction belongs to the task that
        opened it: another task of the same thread touching the store meanwhile (the
        opener awaited inside it) is refused, instead of silently joining or reading
        uncommitted writes."""
        if self._depth and self._owner_thread == threading.get_ident():
            self._check_owner()
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        with self._lock:
            self._begin(time.monotonic() + self.write_timeout)
            self._depth, self._owner_thread, self._owner = 1, threading.get_ident(), current_task()
            try:
                yield
                self._db.execute("COMMIT")
                self._committed()
            except BaseException:
                self._appended = False
                self._after_commit = []
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            finally:
                self._depth, self._owner_thread, self._owner = 0, None, None
            callbacks, self._after_commit = self._after_commit, []
            self._order.due([done(callbacks)])
        self._order.drain()

    def after_commit(self, callback: Callable[[], None]) -> None:
        if self._depth and self._owner_thread == threading.get_ident():
            self._check_owner()
            self._after_commit.append(callback)
        else:
            run_callback(callback)

    def _check_owner(self) -> None:
        if self._depth and current_task() is not self._owner:
            raise RuntimeError(
                "the store is inside a transaction another task opened; "
                "a transaction must not be held across an await"
            )

    def _committed(self) -> None:
        """After a durable commit: wake the peers' followers if it appended events."""
        if self._appended:
            self._appended = False
            if self.peers is not None:
                self.peers.announce()

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """Run one statement: in this thread's write transaction, else on its read-only connection."""
        return self._conn().execute(sql, params)

    def _one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        return self.execute(sql, params).fetchone()

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        return self.execute(sql, params).fetchall()

    def _count(self, sql: str, params: Sequence[Any] = ()) -> int:
        return int(self.execute(sql, params).rowcount)

    # records --------------------------------------------------------------------------

    def get_with_items(
        self, kind: str, id: str, collection: str
    ) -> tuple[Record | None, list[tuple[int, bytes]]]:
        """One statement: the record's row (an idx of NULL sorts first), then its items in
        order, merged from the two primary keys with no sort."""
        found = self._all(_WITH_ITEMS, (kind, id, collection, id))
        record = None
        if found and found[0][0] is None:
            record = rows.record(found[0][1:], _loads)
            found = found[1:]
        return record, [(int(row[0]), bytes(row[-1])) for row in found]

    def insert(self, record: Record) -> None:
        try:
            with self.transaction():
                self._insert_records([record])
                self.note_claim(record.kind, record.id, record.body)
        except sqlite3.IntegrityError as exc:
            raise StoreConflictError(str(exc)) from None

    def _insert_records(self, records: Sequence[Record]) -> None:
        """Rows and tags of new records: two statements (in the write transaction)."""
        lists.insert_rows(
            self._db, _INSERT_RECORDS, 11, [rows.record_params(record, _json) for record in records]
        )
        lists.add_records_tags(self._db, records)

    def update(self, record: Record, expected_revision: int | None = None) -> None:
        with self.transaction():
            current = self._one(
                "SELECT revision, namespace, state, attrs, labels FROM records WHERE kind=? AND id=?",
                (record.kind, record.id),
            )
            if current is None:
                raise KeyError(f"{record.kind} {record.id}")
            if expected_revision is not None and current[0] != expected_revision:
                raise StaleRevisionError(current[0])
            self.execute(
                "UPDATE records SET namespace=?, name=?, revision=?, state=?, attrs=?, labels=?, "
                "update_time=?, body=? WHERE kind=? AND id=?",
                rows.update_params(record, _json),
            )
            _, namespace, state, attrs, labels = current
            lists.retag(
                self._db,
                record.kind,
                record.id,
                (namespace, lists.tags(state, _loads(attrs), _loads(labels))),
                (record.namespace, lists.record_tags(record)),
            )
            self.note_claim(record.kind, record.id, record.body)

    def delete(self, kind: str, id: str, expected_revision: int | None = None) -> bool:
        with self.transaction():
            current = self._one(
                "SELECT revision, namespace, state, attrs, labels, body FROM records WHERE kind=? AND id=?",
                (kind, id),
            )
            if current is None:
                return False
            if expected_revision is not None and current[0] != expected_revision:
                raise StaleRevisionError(current[0])
            self.execute("DELETE FROM records WHERE kind=? AND id=?", (kind, id))
            _, namespace, state, attrs, labels, body = current
            lists.drop_tags(self._db, kind, namespace, id, lists.tags(state, _loads(attrs), _loads(labels)))
            self.note_claim(kind, id, bytes(body))
            return True

    def _list_statement(self, query: ListQuery) -> tuple[str, list[Any]] | None:
        """One page, reading about the page whatever the store holds (sqlite_lists)."""
        return lists.select(query, rows.COLUMN_NAMES)

    # items ----------------------------------------------------------------------------

    def append_items(self, collection: str, owner_id: str, bodies: Sequence[bytes]) -> list[int]:
        with self.transaction():
            row = self._one(
                "SELECT COALESCE(MAX(idx), -1) FROM items WHERE collection=? AND owner_id=?",
                (collection, owner_id),
            )
            start = int(row[0]) + 1
            indices = list(range(start, start + len(bodies)))
            self._db.executemany(
                "INSERT INTO items (collection, owner_id, idx, body) VALUES (?,?,?,?)",
                [(collection, owner_id, idx, body) for idx, body in zip(indices, bodies, strict=True)],
            )
            self.note_claim()
            return indices

    def put_items(self, collection: str, owner_id: str, items: Mapping[int, bytes]) -> None:
        with self.transaction():
            self._db.executemany(
                "INSERT INTO items (collection, owner_id, idx, body) VALUES (?,?,?,?) "
                "ON CONFLICT (collection, owner_id, idx) DO UPDATE SET body=excluded.body",
                [(collection, owner_id, idx, body) for idx, body in items.items()],
            )
            self.note_claim()

    def delete_items(self, collection: str, owner_id: str) -> None:
        with self.transaction():
            self.execute("DELETE FROM items WHERE collection=? AND owner_id=?", (collection, owner_id))

    # events ---------------------------------------------------------------------------

    def append_events(self, events: Sequence[StoredEvent]) -> list[int]:
        """Append events in one transaction; sequences are assigned here, gap-free."""
        with self.transaction():
            row = self._one("SELECT COALESCE(MAX(sequence), 0) FROM events")
            first = int(row[0]) + 1
            sequences = list(range(first, first + len(events)))
            self._appended = self._appended or bool(events)
            self._db.executemany(
                "INSERT INTO events (sequence, namespace, type, plan_id, session_id, time, body) "
                "VALUES (?,?,?,?,?,?,?)",
                [
                    (seq, e.namespace, e.type, e.plan_id, e.session_id, e.time, e.body)
                    for seq, e in zip(sequences, events, strict=True)
                ],
            )
            self.note_claim()
            return sequences

    def read_events(
        self, after_sequence: int, limit: int, where: EventFilter | None = None
    ) -> list[StoredEvent]:
        # The columns' types are already the fields' (INTEGER PRIMARY KEY, TEXT, REAL, BLOB).
        return list(map(StoredEvent._make, self._events(_EVENT_COLUMNS, after_sequence, limit, where)))

    def read_event_bodies(
        self, after_sequence: int, limit: int, where: EventFilter | None = None
    ) -> list[tuple[int, bytes]]:
        # Each column costs the reader thread a Python object per row.
        return self._events("sequence, body", after_sequence, limit, where)

    def last_sequence(self) -> int:
        return int(self._one("SELECT COALESCE(MAX(sequence), 0) FROM events")[0])

    def event_wakeups(self) -> EventWakeups:
        return DataVersionWakeups(
            self.path, self.wakeup_tick, self.peers.listen() if self.peers is not None else None
        )

    # request ids ----------------------------------------------------------------------

    def stamp_request(self, entry: RequestEntry, cutoff: float) -> bool:
        if self._depth and self._owner_thread == threading.get_ident():
            # Inside the write's own transaction (note_claim, on every stamped write): the
            # statement alone, no nested transaction to enter (the shared path, sql_store.py,
            # for the rest).
            params = rows.request_params(entry, cutoff, answer=False)
            return self._db.execute(self.sql.put_request, params).rowcount > 0
        return super().stamp_request(entry, cutoff)

    def sweep_requests(
        self, older_than: float, after: tuple[str, str] | None, limit: int
    ) -> tuple[int, tuple[str, str] | None]:
        """The step a server takes: ``prune_requests`` reads the whole table here (no index
        on time: migration 5)."""
        with self.transaction():
            if after is None:
                found = self._all(_SWEEP_FIRST, (limit,))
            else:
                found = self._all(_SWEEP_AFTER, (*after, limit))
            expired = [
                (principal, request_id, older_than)
                for principal, request_id, time_ in found
                if time_ < older_than
            ]
            if expired:
                self._db.executemany(
                    "DELETE FROM requests WHERE principal=? AND request_id=? AND time < ?", expired
                )
            last = (str(found[-1][0]), str(found[-1][1])) if len(found) == limit else None
            return len(expired), last

    # leases ---------------------------------------------------------------------------

    def _fenced_lease(self, name: str, token: int | None) -> Lease | None:
        """In the write transaction: BEGIN IMMEDIATE holds every other writer off until it
        ends, so the answer holds until the guarded writes commit."""
        return self.get_lease(name)

    def close(self) -> None:
        """Commit what is queued, stop the threads, close every connection."""
        with self._wake:
            self._closing = True
            self._wake.notify_all()
            writer = self._writer
        if writer is not None and writer is not threading.current_thread():
            writer.join()
        self._reads.close()
        self._order.drain()
        with self._lock:
            self._closed = True
            with self._readers_lock:
                readers, self._readers = self._readers, []
            for db in readers:
                db.close()
            if self._cache is not None:
                self._cache.clear()
            self._db.close()
            # After the connections: closing its descriptor first would drop their locks
            # on -shm while they are open (wal_index.py).
            if self._index is not None:
                self._index.close()
        if self.peers is not None:
            self.peers.close()
