"""The store for many replicas: one PostgreSQL database (or one schema of it).

The same ``Store`` as ``SQLiteStore``, built the way PostgreSQL wants to be used: a pool
of connections (psycopg_pool) driven from two small thread pools, so the event loop never
waits and several writes are in flight at once (PostgreSQL commits them concurrently; no
group-commit writer thread is needed).

- ``read(fn)``: one ``REPEATABLE READ, READ ONLY`` transaction, so every statement of
  ``fn`` sees one snapshot and none waits for a writer (pg_transactions.py). The plain
  reads (``read_get``, ``read_with_items``, ``read_query``...) need no thread: the event
  loop sends them on connections of its own in libpq's nonblocking pipeline mode
  (pg_loop_paths.py, pg_loop.py).
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

This module holds the schema and the statements only PostgreSQL runs; those both stores
run are sql_store.py's, failures are mapped in pg_errors.py, and event wake-ups are
pg_wakeups.py's.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, cast

import orjson
import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb, set_json_dumps, set_json_loads
from psycopg_pool import ConnectionPool, PoolTimeout

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
    StoredEvent,
    StoreUnavailableError,
)
from cleveragents.acp.facade.store.delivery import CommitOrder
from cleveragents.acp.facade.store.pg_errors import NulCharacterError as NulCharacterError
from cleveragents.acp.facade.store.pg_errors import reraise
from cleveragents.acp.facade.store.pg_loop import CUSTOM_PLANS
from cleveragents.acp.facade.store.pg_loop_paths import LoopPaths
from cleveragents.acp.facade.store.pg_migrations import PG_MIGRATIONS
from cleveragents.acp.facade.store.pg_settings import (
    CONNECT_TIMEOUT,
    DEFAULT_IDLE_SECONDS,
    connection_info,
    first_schema,
)
from cleveragents.acp.facade.store.pg_statements import INSERT, SQL, clash, insert_params, query_statement
from cleveragents.acp.facade.store.pg_transactions import BEGIN_READ, IN_TRANSACTION
from cleveragents.acp.facade.store.pg_urls import is_postgres_url, redacted
from cleveragents.acp.facade.store.pg_wakeups import PostgresWakeups
from cleveragents.acp.facade.store.pg_wire import PSYCOPG

log = logging.getLogger(__name__)

# How long a replica waits for another one's migration before it gives up.
MIGRATION_WAIT = 300.0
# The statements a read's first round trip sends together (``get_with_items``).
_GET = SQL.get
_ITEMS = SQL.items


def _event(row: Sequence[Any]) -> StoredEvent:
    return StoredEvent(int(row[0]), row[1], row[2], row[3], row[4], float(row[5]), bytes(row[6]))


def _lock_timeout_ms(write_timeout: float) -> int:
    return max(1, round(write_timeout * 1000))


# A write is acknowledged once durable (docs/events.md), whatever default the
# server, the database or the URL's options set: ``off`` is raised to ``on`` (``local`` and
# the standby levels flush locally already, and are kept).
DURABLE_COMMITS = (
    "SELECT set_config('synchronous_commit', 'on', false) WHERE current_setting('synchronous_commit') = 'off'"
)


class PostgresStore(LoopPaths):
    sql = SQL
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
        self._order = CommitOrder()
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
        self._open_threads(readers, writers)
        # The plain reads (``read_get`` and the like) each event loop drives itself (pg_loop.py).
        self._open_loop_paths(
            loop_connections,
            (f"SET lock_timeout = {_lock_timeout_ms(write_timeout)}", CUSTOM_PLANS, DURABLE_COMMITS),
        )

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

    def _list_statement(self, query: ListQuery) -> tuple[str, list[Any]] | None:
        """One page: newest first (or by name), filters as indexed conditions; PostgreSQL's
        planner walks the (kind, id) or (kind, namespace, id) index and stops at the page,
        or reads a filter's GIN matches when they are few."""
        return query_statement(query)

    # records --------------------------------------------------------------------------

    def insert(self, record: Record) -> None:
        with self.transaction():
            if not self._count(INSERT, insert_params(record)):
                raise clash(record)
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
                BEGIN_READ,
            )
        except Exception as exc:
            reraise(exc, started)
        finally:
            # Begun unless it failed before anything was sent.
            here.began = conn.info.transaction_status in IN_TRANSACTION
        if answers is PSYCOPG:
            return super().get_with_items(kind, id, collection)
        records, items = answers
        return (rows.record(records[0], rows.as_decoded) if records else None), rows.items(items)

    def delete_items(self, collection: str, owner_id: str) -> None:
        # One statement, alone outside a write (autocommit): SQLite's needs a transaction.
        self._count(SQL.delete_items, (collection, owner_id))

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
        return [_event(row) for row in self._events(rows.EVENT_COLUMNS, after_sequence, limit, where)]

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
            self._count(SQL.make_lease, (name,))
        row = self._one(SQL.get_lease + " FOR SHARE", (name,))
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
