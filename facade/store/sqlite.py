"""The embedded default store: one SQLite file in WAL mode.

``synchronous=FULL``: a commit returns only after the WAL is on disk, so an acknowledged
write survives a ``kill -9`` and a power cut alike.
"""

from __future__ import annotations

import asyncio
import json
import logging
import pathlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import orjson

from cleveragents.acp.facade.store import sqlite_lists as lists
from cleveragents.acp.facade.store.base import (
    EventFilter,
    ListQuery,
    Record,
    SchemaTooNewError,
    StaleRevisionError,
    Store,
    StoreConflictError,
    StoredEvent,
)
from cleveragents.acp.facade.store.migrations import MIGRATIONS

log = logging.getLogger(__name__)

_COLUMNS = "kind, id, namespace, name, revision, state, attrs, labels, create_time, update_time, body"


def _record(row: sqlite3.Row | tuple[Any, ...]) -> Record:
    kind, id_, namespace, name, revision, state, attrs, labels, created, updated, body = row
    return Record(
        kind=kind,
        id=id_,
        namespace=namespace,
        name=name,
        revision=revision,
        state=state,
        attrs=_loads(attrs),
        labels=_loads(labels),
        create_time=created,
        update_time=updated,
        body=bytes(body),
    )


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


def _current_task() -> asyncio.Task[Any] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


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
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


class SQLiteStore(Store):
    def __init__(self, path: str | pathlib.Path, *, synchronous: str = "FULL") -> None:
        self.path = pathlib.Path(path)
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._depth = 0
        self._after_commit: list[Callable[[], None]] = []
        self._owner: asyncio.Task[Any] | None = None
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA busy_timeout=5000")
        try:
            self.migrate()
        except BaseException:
            self._db.close()
            raise

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
                self._db.execute("BEGIN IMMEDIATE")
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

    # transactions ---------------------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One writer at a time (a lock, and BEGIN IMMEDIATE across processes).

        A transaction belongs to the task that opened it: another task of the same thread
        touching the store meanwhile (the opener awaited inside it) is refused, instead of
        silently joining or reading uncommitted writes."""
        with self._lock:
            if self._depth:
                self._check_owner()
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self._db.execute("BEGIN IMMEDIATE")
            self._depth = 1
            self._owner = _current_task()
            try:
                yield
                self._db.execute("COMMIT")
            except BaseException:
                self._depth = 0
                self._after_commit.clear()
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise
            self._depth = 0
            callbacks, self._after_commit = self._after_commit, []
            for callback in callbacks:
                self._run(callback)

    def after_commit(self, callback: Callable[[], None]) -> None:
        with self._lock:
            if self._depth:
                self._check_owner()
                self._after_commit.append(callback)
            else:
                self._run(callback)

    def _check_owner(self) -> None:
        if self._depth and _current_task() is not self._owner:
            raise RuntimeError(
                "the store is inside a transaction another task opened; "
                "a transaction must not be held across an await"
            )

    @staticmethod
    def _run(callback: Callable[[], None]) -> None:
        """The write is committed and acknowledged; a failing callback must not undo that."""
        try:
            callback()
        except Exception:
            log.exception("after-commit callback %r failed", callback)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """Run one statement (inside the caller's transaction, if any)."""
        with self._lock:
            self._check_owner()
            return self._db.execute(sql, params)

    def _one(self, sql: str, params: Sequence[Any] = ()) -> Any:
        # Fetched under the lock: another thread's transaction cannot interleave.
        with self._lock:
            return self.execute(sql, params).fetchone()

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            return self.execute(sql, params).fetchall()

    # records --------------------------------------------------------------------------

    def get(self, kind: str, id: str) -> Record | None:
        row = self._one(f"SELECT {_COLUMNS} FROM records WHERE kind=? AND id=?", (kind, id))
        return _record(row) if row else None

    def get_by_name(self, kind: str, namespace: str, name: str) -> Record | None:
        row = self._one(
            f"SELECT {_COLUMNS} FROM records WHERE kind=? AND namespace=? AND name=?",
            (kind, namespace, name),
        )
        return _record(row) if row else None

    def insert(self, record: Record) -> None:
        try:
            with self.transaction():
                self.execute(
                    f"INSERT INTO records ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                    (
                        record.kind,
                        record.id,
                        record.namespace,
                        record.name,
                        record.revision,
                        record.state,
                        _json(record.attrs),
                        _json(record.labels),
                        record.create_time,
                        record.update_time,
                        record.body,
                    ),
                )
                lists.add_tags(self._db, record.kind, record.namespace, record.id, lists.record_tags(record))
        except sqlite3.IntegrityError as exc:
            raise StoreConflictError(str(exc)) from None

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
                (
                    record.namespace,
                    record.name,
                    record.revision,
                    record.state,
                    _json(record.attrs),
                    _json(record.labels),
                    record.update_time,
                    record.body,
                    record.kind,
                    record.id,
                ),
            )
            _, namespace, state, attrs, labels = current
            lists.retag(
                self._db,
                record.kind,
                record.id,
                (namespace, lists.tags(state, _loads(attrs), _loads(labels))),
                (record.namespace, lists.record_tags(record)),
            )

    def delete(self, kind: str, id: str, expected_revision: int | None = None) -> bool:
        with self.transaction():
            current = self._one(
                "SELECT revision, namespace, state, attrs, labels FROM records WHERE kind=? AND id=?",
                (kind, id),
            )
            if current is None:
                return False
            if expected_revision is not None and current[0] != expected_revision:
                raise StaleRevisionError(current[0])
            self.execute("DELETE FROM records WHERE kind=? AND id=?", (kind, id))
            _, namespace, state, attrs, labels = current
            lists.drop_tags(self._db, kind, namespace, id, lists.tags(state, _loads(attrs), _loads(labels)))
            return True

    def query(self, query: ListQuery) -> list[Record]:
        """One page, reading about the page whatever the store holds (sqlite_lists)."""
        statement = lists.select(query, _COLUMNS.split(", "))
        if statement is None:
            return []
        return [_record(row) for row in self._all(*statement)]

    def iter_kind(self, kind: str, namespace: str | None = None) -> Iterator[Record]:
        if namespace is None:
            rows = self._all(f"SELECT {_COLUMNS} FROM records WHERE kind=? ORDER BY id", (kind,))
        else:
            rows = self._all(
                f"SELECT {_COLUMNS} FROM records WHERE kind=? AND namespace=? ORDER BY id", (kind, namespace)
            )
        return iter([_record(row) for row in rows])

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
            return indices

    def put_items(self, collection: str, owner_id: str, items: Mapping[int, bytes]) -> None:
        with self.transaction():
            self._db.executemany(
                "INSERT INTO items (collection, owner_id, idx, body) VALUES (?,?,?,?) "
                "ON CONFLICT (collection, owner_id, idx) DO UPDATE SET body=excluded.body",
                [(collection, owner_id, idx, body) for idx, body in items.items()],
            )

    def list_items(self, collection: str, owner_id: str) -> list[tuple[int, bytes]]:
        rows = self._all(
            "SELECT idx, body FROM items WHERE collection=? AND owner_id=? ORDER BY idx",
            (collection, owner_id),
        )
        return [(int(idx), bytes(body)) for idx, body in rows]

    def delete_items(self, collection: str, owner_id: str) -> None:
        self.execute("DELETE FROM items WHERE collection=? AND owner_id=?", (collection, owner_id))

    # events ---------------------------------------------------------------------------

    def append_events(self, events: Sequence[StoredEvent]) -> list[int]:
        """Append events in one transaction; sequences are assigned here, gap-free."""
        with self.transaction():
            row = self._one("SELECT COALESCE(MAX(sequence), 0) FROM events")
            first = int(row[0]) + 1
            sequences = list(range(first, first + len(events)))
            self._db.executemany(
                "INSERT INTO events (sequence, namespace, type, plan_id, session_id, time, body) "
                "VALUES (?,?,?,?,?,?,?)",
                [
                    (seq, e.namespace, e.type, e.plan_id, e.session_id, e.time, e.body)
                    for seq, e in zip(sequences, events, strict=True)
                ],
            )
            return sequences

    def read_events(
        self, after_sequence: int, limit: int, where: EventFilter | None = None
    ) -> list[StoredEvent]:
        clauses = ["sequence > ?"]
        params: list[Any] = [after_sequence]
        if where is not None:
            if where.namespaces is not None:
                if not where.namespaces:
                    return []
                clauses.append(f"namespace IN ({','.join('?' * len(where.namespaces))})")
                params.extend(sorted(where.namespaces))
            for column, value in (("plan_id", where.plan_id), ("session_id", where.session_id)):
                if value:
                    # The literal term is what lets SQLite use the partial index
                    # events_by_plan/events_by_session: resuming one plan or session from
                    # sequence 0 then reads its events, not the whole log.
                    clauses.append(f"{column} = ? AND {column} != ''")
                    params.append(value)
            if where.types:
                clauses.append(f"type IN ({','.join('?' * len(where.types))})")
                params.extend(sorted(where.types))
        params.append(limit)
        rows = self._all(
            "SELECT sequence, namespace, type, plan_id, session_id, time, body FROM events "
            f"WHERE {' AND '.join(clauses)} ORDER BY sequence LIMIT ?",
            params,
        )
        return [StoredEvent(int(r[0]), r[1], r[2], r[3], r[4], float(r[5]), bytes(r[6])) for r in rows]

    def last_sequence(self) -> int:
        return int(self._one("SELECT COALESCE(MAX(sequence), 0) FROM events")[0])

    def first_sequence(self) -> int:
        return int(self._one("SELECT COALESCE(MIN(sequence), 0) FROM events")[0])

    def prune_events(self, *, keep_last: int | None = None, older_than: float | None = None) -> int:
        with self.transaction():
            last = self.last_sequence()
            removed = 0
            if keep_last is not None:
                removed += self.execute(
                    "DELETE FROM events WHERE sequence <= ?", (last - max(keep_last, 1),)
                ).rowcount
            if older_than is not None:
                removed += self.execute(
                    "DELETE FROM events WHERE time < ? AND sequence < ?", (older_than, last)
                ).rowcount
            return removed

    def close(self) -> None:
        with self._lock:
            self._db.close()
