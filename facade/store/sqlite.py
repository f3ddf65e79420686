"""The embedded default store: one SQLite file in WAL mode.

``synchronous=FULL``: a commit returns only after the WAL is on disk, so an acknowledged
write survives a ``kill -9`` and a power cut alike.

Writes go through one writer thread that commits what queued meanwhile as one transaction
(group commit: ``sqlite_writes.py``); reads run on reader threads with connections of their
own, or from memory while nobody commits (``sqlite_reads.py``); in WAL mode a read never
waits for the write lock, whoever holds it. A write lock held by another process (the
``agents`` CLI on the same file, a backup, an ``sqlite3`` shell) is waited for on the
writer thread, in short slices, up to ``write_timeout``: then the waiting calls fail with
StoreBusyError and nothing of them was written. This module holds the file, its schema,
its transactions and the statements only SQLite runs; those both stores run are
``sql_store.py``'s.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

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
    StoreBusyError,
    StoreConflictError,
    StoredEvent,
)
from cleveragents.acp.facade.store.delivery import CommitOrder, current_task, done, run_callback
from cleveragents.acp.facade.store.migrations import MIGRATIONS
from cleveragents.acp.facade.store.requests import RequestEntry
from cleveragents.acp.facade.store.sqlite_reads import SQLiteReads
from cleveragents.acp.facade.store.sqlite_writes import GroupCommit, busy
from cleveragents.acp.facade.store.statements import SQLITE, Statements
from cleveragents.acp.facade.store.wakeups import DEFAULT_WAKEUP_TICK, DataVersionWakeups, PeerChannel
from cleveragents.acp.facade.store.wal_index import WalIndex

_WITH_ITEMS = (
    f"SELECT NULL, {rows.COLUMNS} FROM records WHERE kind=? AND id=? "
    "UNION ALL SELECT idx, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, body "
    "FROM items WHERE collection=? AND owner_id=? ORDER BY 1"
)


_INSERT_RECORDS = f"INSERT INTO records ({rows.COLUMNS}) VALUES "


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


# How long one attempt at the write lock blocks the writer thread before it looks again.
_LOCK_SLICE_MS = 50


# How often a store opening a file another process is creating tries WAL mode again.
_WAL_RETRY_SECONDS = 0.01


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


class SQLiteStore(SQLiteReads, GroupCommit):
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
        # The read cache only in WAL mode: a -shm file left by an earlier WAL session would
        # never change.
        self._index = WalIndex(self.path) if wal and cache_reads else None
        self._open_reads(readers, self._index)
        self._open_writer()
        self._closing = False
        self._closed = False
        # Committed writes whose callbacks and answers are due, in commit order.
        self._order = CommitOrder()

    def _wal_mode(self) -> bool:
        """Switch the file to WAL; whether it is in WAL mode. Processes opening one new file
        together (workers, a CLI beside a server) each need its exclusive lock for that, and
        SQLite answers "database is locked" at once, without its busy handler, to one that
        finds another's write transaction open: it tries again until the write bound."""
        started = time.monotonic()
        while True:
            try:
                return bool(self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal")
            except sqlite3.OperationalError as exc:
                if not busy(exc):
                    self._db.close()
                    raise
                if time.monotonic() - started >= self.write_timeout:
                    self._db.close()
                    raise StoreBusyError(time.monotonic() - started) from None
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
                if not busy(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise StoreBusyError(time.monotonic() - started) from None

    def free_bytes(self) -> int | None:
        """Free bytes on the file system of the database (where its WAL grows)."""
        try:
            stat = os.statvfs(self.path.parent)
        except OSError:
            return None
        return stat.f_bavail * stat.f_frsize

    # connections ----------------------------------------------------------------------

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
        # In a transaction, unlike PostgreSQL's: outside a write this connection is read-only.
        with self.transaction():
            self._count(self.sql.delete_items, (collection, owner_id))

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
        # The columns' types are already the fields' (INTEGER PRIMARY KEY, TEXT, REAL, BLOB):
        # no conversion per field, unlike PostgreSQL's (a backlog read's hot path).
        return list(map(StoredEvent._make, self._events(rows.EVENT_COLUMNS, after_sequence, limit, where)))

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
