"""PostgresStore: what only the replica store has (the conformance suite runs in
test_conformance.py): its URL and schema, migrations under an advisory lock, the
gap-free event sequence with writers in several processes, a bounded wait for a foreign
lock, conditional writes across connections, and event wake-ups. Longer than 600 lines:
the cases above share its fixtures (fresh schemas, a second process appending), and each
is short."""

from __future__ import annotations

import asyncio
import contextlib
import decimal
import pathlib
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import pq, sql

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade import factory
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.store import pg_loop, pg_migrations, pg_wire, postgres
from cleveragents.acp.facade.store.base import (
    Record,
    SchemaTooNewError,
    StaleRevisionError,
    Store,
    StoreBusyError,
    StoreConflictError,
    StoreDownError,
    StoreUnavailableError,
)
from cleveragents.acp.facade.store.pg_settings import first_schema
from cleveragents.acp.facade.store.pg_urls import db_problem, is_postgres_url, redacted
from cleveragents.acp.facade.store.postgres import PostgresStore
from cleveragents.acp.facade.store.requests import CLAIM, Claim, RequestEntry
from cleveragents.acp.v1 import session_pb2
from tests import postgres as pg
from tests.facade.store import pg_appender
from tests.facade.store.conformance import event, fails_in_transaction, record

TIMEOUT = 60


@pytest.fixture
def schema() -> Iterator[tuple[str, str]]:
    """(URL, schema name) of a fresh schema."""
    with pg.fresh_schema() as url:
        yield url, url.rsplit("search_path%3D", 1)[1]


@pytest.fixture
def opened(schema: tuple[str, str]) -> Iterator[Callable[..., PostgresStore]]:
    stores: list[PostgresStore] = []

    def open_store(**kw: float) -> PostgresStore:
        stores.append(PostgresStore(schema[0], **kw))  # type: ignore[arg-type]
        return stores[-1]

    yield open_store
    for store in stores:
        store.close()


def raw(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(url, autocommit=True, connect_timeout=10)


def test_urls_are_recognized_and_shown_without_their_password() -> None:
    assert is_postgres_url("postgresql://u@h/db")
    assert is_postgres_url("postgres://h/db")
    assert not is_postgres_url("/var/lib/acp.db")
    assert not is_postgres_url(pathlib.Path("postgresql://u@h/db"))
    assert redacted("postgresql://me:s3cret@db:5432/acp?options=-csearch_path%3Dx") == (
        "postgresql://me:***@db:5432/acp?options=-csearch_path%3Dx"
    )
    assert redacted("postgresql://db/acp?password=s3cret&sslmode=require") == (
        "postgresql://db/acp?password=***&sslmode=require"
    )
    assert redacted("postgresql://me@db/acp") == "postgresql://me@db/acp"


def test_a_url_of_another_scheme_is_no_sqlite_file(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``postgressql://`` (a typo) was opened as a SQLite file of that name, in a folder
    ``postgressql:`` made for it; ``agents serve --db`` and local mode refuse it now."""
    monkeypatch.chdir(tmp_path)
    assert db_problem("postgresql://h/db") is None
    assert db_problem("acp.db") is None
    assert db_problem(pathlib.Path("x://y")) is None
    with pytest.raises(ValueError, match="unknown URL scheme 'postgressql://'"):
        factory.open_store("postgressql://me:s3cret@h/db")
    assert list(tmp_path.iterdir()) == []
    assert first_schema('"$user", public') == "public"
    assert first_schema('"My ""odd"", schema" , public') == 'My "odd", schema'
    assert first_schema("") is None


def test_a_new_schema_named_by_the_url_is_created_at_the_latest_version(
    schema: tuple[str, str], opened: Callable[..., PostgresStore]
) -> None:
    name = schema[1]
    store = opened()
    assert store.schema == name
    assert store.schema_version == len(pg_migrations.PG_MIGRATIONS)
    with raw(pg.URL) as conn:
        tables = {
            row[0]
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (name,)
            )
        }
    assert {"records", "items", "events", "event_sequence", "acp_schema"} <= tables


def test_an_old_schema_is_upgraded_on_open(
    schema: tuple[str, str], opened: Callable[..., PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A schema written by a release that knew fewer steps opens under one that adds a step
    (with a ``;`` inside a function body): the step runs once, the old data stays."""
    old = opened()
    old.insert(record(id="01A", name="alpha", state="active", attrs={"project": "p"}))
    old.append_events([event(plan_id="p1")])
    old.close()
    upgrade = """
        ALTER TABLE records ADD COLUMN probe TEXT NOT NULL DEFAULT 'upgraded';
        CREATE TABLE upgrade_marker (id SERIAL PRIMARY KEY, note TEXT NOT NULL);
        CREATE FUNCTION note_new_record() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO upgrade_marker (note) VALUES ('record; added');
            RETURN NEW;
        END $$;
        CREATE TRIGGER note_new_records AFTER INSERT ON records
            FOR EACH ROW EXECUTE FUNCTION note_new_record();
        INSERT INTO upgrade_marker (note) VALUES ('ran; once')
    """
    monkeypatch.setattr(postgres, "PG_MIGRATIONS", (*pg_migrations.PG_MIGRATIONS, upgrade))
    new = opened()
    assert new.schema_version == len(pg_migrations.PG_MIGRATIONS) + 1
    assert new.get("session", "01A") is not None
    assert new.execute("SELECT probe FROM records WHERE id = '01A'") == [("upgraded",)]
    assert [e.sequence for e in new.read_events(0, 10)] == [1]
    assert new.append_events([event()]) == [2]
    new.close()
    again = opened()
    again.insert(record(id="01B"))
    assert [row[0] for row in again.execute("SELECT note FROM upgrade_marker ORDER BY id")] == [
        "ran; once",
        "record; added",
    ]


def test_a_failed_migration_leaves_the_schema_at_its_old_version(
    schema: tuple[str, str], opened: Callable[..., PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    opened().close()
    broken = "CREATE TABLE half_done (x INTEGER); INSERT INTO no_such_table VALUES (1)"
    monkeypatch.setattr(postgres, "PG_MIGRATIONS", (*pg_migrations.PG_MIGRATIONS, broken))
    with pytest.raises(StoreUnavailableError, match="no_such_table") as info:
        opened()
    assert isinstance(info.value.__cause__, psycopg.errors.UndefinedTable)
    monkeypatch.setattr(postgres, "PG_MIGRATIONS", pg_migrations.PG_MIGRATIONS)
    store = opened()
    assert store.schema_version == len(pg_migrations.PG_MIGRATIONS)
    assert store.execute("SELECT to_regclass('half_done')") == [(None,)]


def test_a_schema_from_a_newer_release_is_refused(
    schema: tuple[str, str], opened: Callable[..., PostgresStore]
) -> None:
    opened().close()
    with raw(schema[0]) as conn:
        conn.execute("UPDATE acp_schema SET version = %s", (len(pg_migrations.PG_MIGRATIONS) + 5,))
    with pytest.raises(SchemaTooNewError, match="schema version"):
        opened()


def test_replicas_opening_one_new_schema_together_migrate_it_once(schema: tuple[str, str]) -> None:
    """Four processes at once on a schema that does not exist yet: each step's CREATE TABLE
    would fail if it ran twice, so all four succeeding is the proof."""
    code = (
        "import sys\n"
        "from cleveragents.acp.facade.store.postgres import PostgresStore\n"
        "PostgresStore(sys.argv[1]).close()\n"
    )
    children = [
        subprocess.Popen([sys.executable, "-c", code, schema[0]], stderr=subprocess.PIPE) for _ in range(4)
    ]
    try:
        for child in children:
            _, err = child.communicate(timeout=TIMEOUT)
            assert child.returncode == 0, err.decode()
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    store = PostgresStore(schema[0])
    try:
        assert store.schema_version == len(pg_migrations.PG_MIGRATIONS)
    finally:
        store.close()


def test_an_unreachable_server_is_one_clear_error() -> None:
    with pytest.raises(
        StoreUnavailableError, match=r"cannot connect to postgresql://me:\*\*\*@127.0.0.1:1/x"
    ):
        PostgresStore("postgresql://me:s3cret@127.0.0.1:1/x?connect_timeout=3")


# the event sequence across processes ----------------------------------------------------


def follow(url: str, table: str, writers: list[subprocess.Popen[str]]) -> tuple[list[int], list[int]]:
    """Poll ``sequence > last`` as a follower on another replica would, until every writer
    is done and nothing new appears; returns (what it read, in order; what the table holds)."""
    seen: list[int] = []
    query = sql.SQL("SELECT sequence FROM {} WHERE sequence > %s ORDER BY sequence LIMIT 500").format(
        sql.Identifier(table)
    )
    with raw(url) as conn:
        for _ in range(1_000_000):
            finished = all(w.poll() is not None for w in writers)
            rows = conn.execute(query, (seen[-1] if seen else 0,)).fetchall()
            seen.extend(int(r[0]) for r in rows)
            if finished and not rows:
                break
        final = [
            int(r[0])
            for r in conn.execute(
                sql.SQL("SELECT sequence FROM {} ORDER BY sequence").format(sql.Identifier(table))
            )
        ]
    return seen, final


def appenders(url: str, mode: str, count: int = 4, transactions: int = 150) -> list[subprocess.Popen[str]]:
    return [
        subprocess.Popen(
            [sys.executable, pg_appender.__file__, url, mode, str(transactions), str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in range(count)
    ]


def committed(writers: list[subprocess.Popen[str]]) -> int:
    total = 0
    for writer in writers:
        out, err = writer.communicate(timeout=TIMEOUT)
        assert writer.returncode == 0, err
        number, done = out.split()
        assert done == "done"
        total += int(number)
    return total


def test_a_follower_never_skips_a_sequence_with_writers_in_several_processes(
    schema: tuple[str, str], opened: Callable[..., PostgresStore]
) -> None:
    """Four processes append in transactions held open a random while after their sequences
    are taken, rolling back one in five; a follower polling ``sequence > last`` reads every
    committed event, and the log is 1..n without a hole."""
    opened().close()
    writers = appenders(schema[0], "store")
    try:
        seen, final = follow(schema[0], "events", writers)
        total = committed(writers)
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
                writer.wait(10)
    assert final == list(range(1, total + 1))
    assert seen == final


def test_the_follower_does_catch_a_skip_where_sequences_are_taken_before_commit(
    schema: tuple[str, str], opened: Callable[..., PostgresStore]
) -> None:
    """The control: the same follower over a BIGSERIAL key (numbers taken at insert, not in
    commit order) misses events that commit after a higher number was read."""
    opened().close()
    with raw(schema[0]) as conn:
        conn.execute("CREATE TABLE serial_events (sequence BIGSERIAL PRIMARY KEY)")
    missed: set[int] = set()
    for _ in range(20):
        writers = appenders(schema[0], "serial", transactions=100)
        try:
            seen, final = follow(schema[0], "serial_events", writers)
            committed(writers)
        finally:
            for writer in writers:
                if writer.poll() is None:
                    writer.kill()
                    writer.wait(10)
        missed |= set(final) - set(seen)
        if missed:
            break
    assert missed


# locks -----------------------------------------------------------------------------------


async def test_a_foreign_lock_is_waited_for_then_store_busy_and_reads_go_on(
    schema: tuple[str, str], opened: Callable[..., PostgresStore]
) -> None:
    store = opened(write_timeout=0.5)
    store.append_events([event()])

    def append(s: Store) -> list[int]:
        return s.append_events([event()])

    with raw(schema[0]) as locker:
        locker.execute("BEGIN")
        locker.execute("SELECT last FROM event_sequence FOR UPDATE")
        with pytest.raises(StoreBusyError) as info:
            await store.write(append)
        assert info.value.details["refinement"] == "STORE_BUSY"
        assert info.value.details["retryable"] is True
        assert await asyncio.wait_for(store.read(lambda s: s.last_sequence()), 10) == 1
        with pytest.raises(StoreBusyError):
            store.append_events([event()])
        waiting = asyncio.ensure_future(store.write(append))
        await asyncio.sleep(0.1)
        locker.execute("ROLLBACK")
    # Waited for less than its bound: it goes through once the lock is gone.
    assert await asyncio.wait_for(waiting, 10) in ([2], [3])
    assert [e.sequence for e in store.read_events(0, 10)] in ([1, 2], [1, 2, 3])


async def test_conditional_writes_hold_across_connections(opened: Callable[..., PostgresStore]) -> None:
    """Two replicas update one record from revision 1 at once: one wins, the other is told
    the revision moved; appends to one owner from many connections stay 0..n-1."""
    first, second = opened(), opened()
    first.insert(record(id="01A"))
    barrier = threading.Barrier(2)

    def bump(s: Store) -> None:
        barrier.wait(10)
        s.update(record(id="01A", revision=2, state="mine"), expected_revision=1)

    results = await asyncio.gather(first.write(bump), second.write(bump), return_exceptions=True)
    assert sorted(type(r).__name__ for r in results) == ["NoneType", "StaleRevisionError"]
    assert isinstance(next(r for r in results if r is not None), StaleRevisionError)

    def append(s: Store) -> list[int]:
        return s.append_items("messages", "01A", [b"a", b"b"])

    appended = await asyncio.gather(*(store.write(append) for store in (first, second) * 8))
    assert sorted(i for indices in appended for i in indices) == list(range(32))
    assert [i for i, _ in first.list_items("messages", "01A")] == list(range(32))


def waiting_on_a_lock(application: str, bound: float = 20.0) -> bool:
    """Whether the connections named ``application`` wait for a lock, looked at until
    ``bound`` seconds passed."""
    with raw(pg.URL) as conn:
        deadline = time.monotonic() + bound
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = %s AND wait_event_type = 'Lock'",
                (application,),
            ).fetchone()
            if row and row[0]:
                return True
            time.sleep(0.02)
    return False


def test_a_record_read_in_a_write_is_locked_until_the_write_ends(
    schema: tuple[str, str], opened: Callable[..., PostgresStore]
) -> None:
    """Replica B reads a record replica A has read in its open write: B waits, then reads
    A's version, so both read-modify-writes apply (no StaleRevisionError, no lost update)."""
    first = opened()
    application = f"acp_waiter_{secrets.token_hex(4)}"
    second = PostgresStore(f"{schema[0]}&application_name={application}")
    first.insert(record(id="01A", attrs={"n": "0"}))
    holding, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def bump(store: PostgresStore, hold: bool) -> None:
        try:
            with store.transaction():
                got = store.get("session", "01A")
                assert got is not None
                if hold:
                    holding.set()
                    assert release.wait(30)
                changed = record(
                    id="01A", revision=got.revision + 1, attrs={"n": str(int(got.attrs["n"]) + 1)}
                )
                store.update(changed, expected_revision=got.revision)
        except BaseException as exc:
            errors.append(exc)

    a = threading.Thread(target=bump, args=(first, True))
    b = threading.Thread(target=bump, args=(second, False))
    try:
        a.start()
        assert holding.wait(30)
        b.start()
        assert waiting_on_a_lock(application)
    finally:
        release.set()
        a.join(30)
        b.join(30)
        second.close()
    assert errors == []
    got = first.get("session", "01A")
    assert got is not None
    assert (got.revision, got.attrs) == (3, {"n": "2"})


# wake-ups ------------------------------------------------------------------------------


def test_wakeups_come_after_a_commit_anywhere_and_not_for_a_rollback(
    opened: Callable[..., PostgresStore],
) -> None:
    listener, writer = opened(), opened()
    wakeups = listener.event_wakeups()
    try:
        assert wakeups.wait(0.3) is False
        fails_in_transaction(writer, lambda: writer.append_events([event()]))
        assert wakeups.wait(0.5) is False
        writer.append_events([event()])
        assert wakeups.wait(10) is True
        assert listener.read_events(0, 10)[0].sequence == 1
        # A close from another thread ends a wait in progress soon.
        closer = threading.Timer(0.3, wakeups.close)
        closer.start()
        assert wakeups.wait(30) is False
        closer.join(10)
    finally:
        wakeups.close()


# round trips -----------------------------------------------------------------------------


def waits(trace: str) -> int:
    """How often the client waited for the server in a libpq trace: each turn from lines it
    sent (F) to lines it received (B)."""
    turns, last = 0, ""
    for line in trace.splitlines():
        direction = line[:1]
        if direction == "B" and last == "F":
            turns += 1
        if direction in ("F", "B"):
            last = direction
    return turns


async def test_a_one_statement_read_waits_for_the_server_once(
    opened: Callable[..., PostgresStore], tmp_path: pathlib.Path
) -> None:
    """A read's BEGIN travels with its first statement and its COMMIT is not waited for
    (pg_wire.py): one round trip for a one-statement read and two for a two-statement one
    (three and four when BEGIN and COMMIT each waited), counted in libpq's own trace of the
    reader's connection, with the answers unchanged."""
    store = opened(readers=1)
    store.insert(record(id="01A"))

    def one(s: Store) -> object:
        return s.get("session", "01A")

    def two(s: Store) -> object:
        return s.get("session", "01A"), s.list_items("messages", "01A")

    for fn in (one, two):  # prepares the statements on the reader's connection
        await store.read(fn)
    (reader,) = store._pinned
    for fn, expected in ((one, 1), (two, 2)):
        path = tmp_path / f"{fn.__name__}.trace"
        with path.open("w") as file:
            reader.pgconn.trace(file.fileno())
            reader.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            answers = [await store.read(fn) for _ in range(5)]
            reader.pgconn.untrace()
        assert waits(path.read_text()) == 5 * expected, fn.__name__
        assert answers == [answers[0]] * 5
    assert (await store.read(one)) == store.get("session", "01A")


async def test_each_read_sees_what_committed_before_it_and_a_failed_one_leaves_none_open(
    opened: Callable[..., PostgresStore], schema: tuple[str, str]
) -> None:
    """The COMMIT a read leaves unread ends its snapshot before the next read begins, also
    when psycopg runs the next read's first statement; a read whose first statement fails
    (on the server, or before anything was sent) rolls back and the next read on the same
    connection works."""
    store = opened(readers=1)
    store.insert(record(id="01A", state="one"))
    update = sql.SQL("UPDATE {}.records SET state = %s WHERE id = '01A'").format(sql.Identifier(schema[1]))
    with raw(schema[0]) as conn:
        for state in ("two", "three"):
            conn.execute(update, (state,))
            found = await store.read(lambda s: s.get("session", "01A"))
            assert found is not None
            assert found.state == state
    for _ in range(2):  # a first statement psycopg runs (numeric), after a COMMIT owed
        assert await store.read(lambda _s: store.execute("SELECT 1.5::numeric")) == [
            (decimal.Decimal("1.5"),)
        ]
    with pytest.raises(psycopg.errors.UndefinedTable):
        await store.read(lambda _s: store.execute("SELECT * FROM no_such_table"))
    with pytest.raises(postgres.NulCharacterError):
        await store.read(lambda s: s.get("session", "01\x00"))
    with pytest.raises(postgres.NulCharacterError):
        await store.read(lambda s: s.get_with_items("session", "01\x00", "messages"))

    def after_a_refused_statement(s: Store) -> tuple[Record | None, int]:
        with contextlib.suppress(postgres.NulCharacterError):
            s.get("session", "01\x00")
        with contextlib.suppress(postgres.NulCharacterError):
            s.get_with_items("session", "01\x00", "messages")
        return s.get("session", "01A"), s.last_sequence()

    found, last = await store.read(after_a_refused_statement)
    assert found is not None
    assert found.state == "three"
    assert last == 0


def terminate(url: str, pid: int) -> None:
    """End a server backend and wait until it is gone."""
    with raw(url) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        while conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            time.sleep(0.01)


async def test_a_reader_connection_lost_with_its_commit_unread_is_replaced(
    opened: Callable[..., PostgresStore], schema: tuple[str, str]
) -> None:
    """The server ends the reader's connection while the answer to its last COMMIT is still
    unread: the next read fails with the connection error, as STORE_UNAVAILABLE (retryable;
    it does not hang or read a stale answer), and the read after that runs on a new connection."""
    store = opened(readers=1)
    store.insert(record(id="01A"))
    await store.read(lambda s: s.get("session", "01A"))  # prepared on the reader's connection
    ((pid,),) = await store.read(lambda _s: store.execute("SELECT pg_backend_pid()"))
    await asyncio.to_thread(terminate, schema[0], pid)
    with pytest.raises(ACPError, match="server closed the connection") as lost:
        await store.read(lambda s: s.get("session", "01A"))
    assert lost.value.details["refinement"] == "STORE_UNAVAILABLE"
    assert lost.value.details["retryable"] is True
    found = await store.read(lambda s: s.get("session", "01A"))
    assert found is not None
    assert found.id == "01A"
    ((other,),) = await store.read(lambda _s: store.execute("SELECT pg_backend_pid()"))
    assert other != pid


# reads the event loop drives (pg_loop.py) ---------------------------------------------------

SLEEP = "SELECT pg_sleep(%s)"


async def sleeping_backend(url: str) -> int:
    """The pid of the backend running a pg_sleep, once it does."""
    for _ in range(500):
        with raw(url) as conn:
            row = conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND state = 'active' "
                "AND query LIKE %s",
                ("%pg_sleep%",),
            ).fetchone()
        if row is not None:
            return int(row[0])
        await asyncio.sleep(0.01)
    raise AssertionError("no backend ran the sleep")


async def test_a_loop_read_sees_one_snapshot_while_writes_commit(
    opened: Callable[..., PostgresStore],
) -> None:
    """Each write moves a session's revision and adds one message in one transaction: every
    ``read_with_items`` meanwhile (many at once, pipelined on two connections) sees a
    revision and a message count that agree, never half a write."""
    store = opened()
    store.insert(record(id="01A", revision=1))

    def bump(s: Store) -> None:
        current = s.get("session", "01A")
        assert current is not None
        s.update(record(id="01A", revision=current.revision + 1), expected_revision=current.revision)
        s.append_items("messages", "01A", [b"m"])

    async def writes() -> None:
        for _ in range(30):
            await store.write(bump)

    async def reads() -> list[tuple[int, int]]:
        seen = []
        for _ in range(20):
            answers = await asyncio.gather(
                *(store.read_with_items("session", "01A", "messages") for _ in range(20))
            )
            for found, items in answers:
                assert found is not None
                seen.append((found.revision, len(items)))
        return seen

    _, seen = await asyncio.gather(writes(), reads())
    assert all(revision == count + 1 for revision, count in seen), seen
    assert len(store._loops) == 1
    assert len(next(iter(store._loops.values()))._pipelines) <= 2


async def test_many_concurrent_loop_reads_each_get_their_own_answer(
    opened: Callable[..., PostgresStore],
) -> None:
    store = opened(loop_connections=3)
    for index in range(50):
        store.insert(record(id=f"01{index:02}", state=f"s{index}"))
        store.append_items("messages", f"01{index:02}", [f"m{index}".encode()] * (index % 4))
    ids = [f"01{index % 60:02}" for index in range(1000)]
    answers = await asyncio.gather(*(store.read_with_items("session", id, "messages") for id in ids))
    for id, (found, items) in zip(ids, answers, strict=True):
        index = int(id[2:])
        if index >= 50:
            assert (found, items) == (None, [])
            continue
        assert found is not None
        assert (found.id, found.state) == (id, f"s{index}")
        assert items == [(n, f"m{index}".encode()) for n in range(index % 4)]


async def test_a_cancelled_loop_read_leaves_the_pipeline_in_step(
    opened: Callable[..., PostgresStore],
) -> None:
    """A caller that stops waiting: the reads queued behind its read on the same connection
    get their own answers, and so do the ones after."""
    store = opened(loop_connections=1)
    store.insert(record(id="01A"))
    store.insert(record(id="01B"))
    assert await store.read_get("session", "01A") is not None  # the connection is open
    slow = asyncio.ensure_future(store._loop_read([(SLEEP, (0.3,))]))
    behind = [asyncio.ensure_future(store.read_get("session", id)) for id in ("01A", "01B", "01C")]
    await asyncio.sleep(0.05)
    slow.cancel()
    with pytest.raises(asyncio.CancelledError):
        await slow
    found = await asyncio.gather(*behind)
    assert [r.id if r else None for r in found] == ["01A", "01B", None]
    for _ in range(3):
        again = await store.read_with_items("session", "01B", "messages")
        assert again[0] is not None
        assert again[0].id == "01B"


async def test_a_loop_connection_ended_mid_read_fails_its_reads_and_is_replaced(
    opened: Callable[..., PostgresStore], schema: tuple[str, str]
) -> None:
    """The server ends a loop connection while reads wait on it: they fail with the
    connection's error (none hangs), and the next read runs on a new connection."""
    store = opened(loop_connections=1)
    store.insert(record(id="01A"))
    assert await store.read_get("session", "01A") is not None
    slow = asyncio.ensure_future(store._loop_read([(SLEEP, (5,))]))
    behind = asyncio.ensure_future(store.read_get("session", "01A"))
    pid = await sleeping_backend(schema[0])
    await asyncio.to_thread(terminate, schema[0], pid)
    for waiting in (slow, behind):
        # The lost connection is the store's own refusal: retryable STORE_UNAVAILABLE.
        with pytest.raises(StoreDownError):
            await asyncio.wait_for(waiting, TIMEOUT)
    found = await store.read_get("session", "01A")
    assert found is not None
    assert found.id == "01A"
    (reads,) = store._loops.values()
    (pipeline,) = reads._pipelines
    assert pipeline._pgconn.backend_pid != pid


async def test_an_idle_loop_connection_the_server_ends_is_replaced_before_the_next_read(
    opened: Callable[..., PostgresStore], schema: tuple[str, str]
) -> None:
    store = opened(loop_connections=1)
    store.insert(record(id="01A"))
    assert await store.read_get("session", "01A") is not None
    (reads,) = store._loops.values()
    (pipeline,) = reads._pipelines
    pid = pipeline._pgconn.backend_pid
    await asyncio.to_thread(terminate, schema[0], pid)
    for _ in range(100):  # the loop hears the connection go
        if not reads._pipelines:
            break
        await asyncio.sleep(0.01)
    found = await store.read_get("session", "01A")
    assert found is not None
    assert found.id == "01A"


async def test_loop_reads_map_errors_and_fall_back_as_reads_do(opened: Callable[..., PostgresStore]) -> None:
    """A NUL is the caller's error, a server error is itself, a column type the loop path
    does not decode sends the read through the threads, and the next read is fine."""
    store = opened(loop_connections=1)
    store.insert(record(id="01A"))
    with pytest.raises(postgres.NulCharacterError):
        await store.read_get("session", "01\x00")
    with pytest.raises(postgres.NulCharacterError):
        await store.read_with_items("session", "01A", "m\x00")
    with pytest.raises(psycopg.errors.UndefinedTable):
        await store._loop_read([("SELECT * FROM no_such_table WHERE id = %s", ("x",))])
    with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
        await store._loop_read([("DELETE FROM records WHERE id = %s", ("01A",))])
    assert await store._loop_read([("SELECT 1.5::numeric, %s::text", ("x",))]) is pg_wire.PSYCOPG
    found = await store.read_get("session", "01A")
    assert found is not None


async def test_aclose_finishes_the_loop_reads_under_way(opened: Callable[..., PostgresStore]) -> None:
    store = opened(loop_connections=1)
    store.insert(record(id="01A"))
    assert await store.read_get("session", "01A") is not None
    slow = asyncio.ensure_future(store._loop_read([(SLEEP, (0.2,))]))
    behind = asyncio.ensure_future(store.read_get("session", "01A"))
    await asyncio.sleep(0.05)
    await store.aclose()
    assert await slow == [[(None,)]]
    found = await behind
    assert found is not None
    with pytest.raises(RuntimeError, match="closed"):
        await store.read_get("session", "01A")


async def test_close_from_another_thread_fails_the_loop_reads_still_waiting(
    opened: Callable[..., PostgresStore],
) -> None:
    store = opened(loop_connections=1)
    assert await store.read_get("session", "01A") is None
    slow = asyncio.ensure_future(store._loop_read([(SLEEP, (5,))]))
    await asyncio.sleep(0.05)
    await asyncio.wait_for(asyncio.to_thread(store.close), TIMEOUT)
    with pytest.raises(RuntimeError, match="closed"):
        await asyncio.wait_for(slow, TIMEOUT)


# a write the event loop drives (pg_loop.py: LoopWrites) --------------------------------------


def write_lane(store: PostgresStore) -> Any:
    (writes,) = store._loop_writes.values()
    return writes


async def test_concurrent_loop_inserts_commit_together_and_each_is_answered(
    opened: Callable[..., PostgresStore], schema: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 inserts at once on one connection: each is answered once it is committed (a
    reader on another connection sees it then), they go in far fewer segments (commits) than
    inserts, and a clash among them is its own caller's StoreConflictError alone."""
    segments: list[int] = []
    send = pg_loop._Pipeline.send

    def counted(self: Any, sends: Any) -> Any:
        segments.append(len(sends))
        return send(self, sends)

    monkeypatch.setattr(pg_loop._Pipeline, "send", counted)
    store = opened(loop_connections=1)
    await store.insert_alone(record(id="01DUP"))

    def visible(id: str) -> bool:
        with raw(schema[0]) as conn:
            return conn.execute("SELECT 1 FROM records WHERE id = %s", (id,)).fetchone() is not None

    async def insert(id: str) -> str:
        try:
            await store.insert_alone(record(id=id))
        except StoreConflictError:
            return "clash"
        return "seen" if await asyncio.to_thread(visible, id) else "unseen"

    ids = [f"01N{index:03}" for index in range(200)]
    ids.insert(100, "01DUP")
    answers = await asyncio.gather(*(insert(id) for id in ids))
    assert answers[100] == "clash"
    assert answers.count("seen") == 200
    assert store.execute("SELECT count(*) FROM records") == [(201,)]
    assert sum(segments) == 1 + 201
    assert len(segments) < 20, segments
    (pipeline,) = write_lane(store)._pipelines
    assert pipeline.depth == 0


async def test_a_failing_insert_fails_alone_and_the_others_of_its_segment_commit(
    opened: Callable[..., PostgresStore],
) -> None:
    """A revision past bigint is the server's error: the segment it shared rolls back, its
    writes go again one by one, and only that one fails."""
    store = opened(loop_connections=1)
    await store.insert_alone(record(id="01A"))
    slow = asyncio.ensure_future(store._loop_read([(SLEEP, (0.0,))]))
    await slow
    first = asyncio.ensure_future(store.insert_alone(record(id="01F")))
    queued = [
        asyncio.ensure_future(
            store.insert_alone(record(id=f"01Q{index}", revision=2**70 if index == 3 else 1))
        )
        for index in range(6)
    ]
    await first
    results = await asyncio.gather(*queued, return_exceptions=True)
    assert isinstance(results[3], psycopg.errors.NumericValueOutOfRange)
    assert [r for index, r in enumerate(results) if index != 3] == [None] * 5
    ids = {row[0] for row in store.execute("SELECT id FROM records")}
    assert ids == {"01A", "01F", *(f"01Q{index}" for index in range(6) if index != 3)}


async def test_a_loop_insert_waiting_for_a_lock_held_elsewhere_is_store_busy(
    opened: Callable[..., PostgresStore], schema: tuple[str, str]
) -> None:
    """Another transaction inserted the same id and holds it: the insert waits for the
    store's bound, then fails retryably; the next insert is fine."""
    store = opened(loop_connections=1, write_timeout=0.3)
    with raw(schema[0]) as holder:
        holder.execute("BEGIN")
        holder.execute(
            "INSERT INTO records (kind, id, namespace, name, revision, state, attrs, labels, "
            "create_time, update_time, body) VALUES ('session', '01L', 'default', '', 1, '', "
            "'{}', '{}', 0, 0, '')"
        )
        started = time.monotonic()
        with pytest.raises(StoreBusyError):
            await asyncio.wait_for(store.insert_alone(record(id="01L")), TIMEOUT)
        assert time.monotonic() - started >= 0.25
        holder.execute("ROLLBACK")
    await store.insert_alone(record(id="01L"))
    found = await store.read_get("session", "01L")
    assert found is not None


async def test_a_nul_in_a_loop_insert_is_the_callers_error(opened: Callable[..., PostgresStore]) -> None:
    store = opened(loop_connections=1)
    with pytest.raises(postgres.NulCharacterError):
        await store.insert_alone(record(id="01\x00"))
    with pytest.raises(postgres.NulCharacterError):
        await store.insert_alone(record(id="01B", labels={"k": "v\x00"}))
    await store.insert_alone(record(id="01B"))


async def test_a_write_connection_ended_mid_write_fails_its_writes_and_is_replaced(
    opened: Callable[..., PostgresStore], schema: tuple[str, str]
) -> None:
    """The server ends the write connection while an insert waits on a lock there: the
    insert fails with the connection's error (its commit may or may not have been made, so it
    is not tried again), none hangs, and the next insert runs on a new connection."""
    store = opened(loop_connections=1)
    await store.insert_alone(record(id="01A"))
    pid = write_lane(store)._pipelines[0]._pgconn.backend_pid
    with raw(schema[0]) as holder:
        holder.execute("BEGIN")
        holder.execute("SELECT 1 FROM records WHERE id = '01A' FOR UPDATE")
        holder.execute("LOCK TABLE records IN EXCLUSIVE MODE")
        waiting = asyncio.ensure_future(store.insert_alone(record(id="01W")))
        await asyncio.sleep(0.2)
        await asyncio.to_thread(terminate, schema[0], pid)
        with pytest.raises(StoreDownError):
            await asyncio.wait_for(waiting, TIMEOUT)
        holder.execute("ROLLBACK")
    await store.insert_alone(record(id="01B"))
    (pipeline,) = write_lane(store)._pipelines
    assert pipeline._pgconn.backend_pid != pid
    ids = {row[0] for row in store.execute("SELECT id FROM records")}
    assert ids == {"01A", "01B"}


async def test_a_loop_insert_under_a_request_claim_goes_through_the_writer_threads(
    opened: Callable[..., PostgresStore],
) -> None:
    """Its request row must be written in the same transaction: no loop connection opens."""
    store = opened(loop_connections=1)
    entry = RequestEntry(
        principal="p", request_id="r1", operation="session.create", digest=b"d", owner="o", time=time.time()
    )
    claim = Claim(entry, cutoff=0.0)
    token = CLAIM.set(claim)
    try:
        await store.insert_alone(record(id="01C"))
    finally:
        CLAIM.reset(token)
    assert claim.stamped
    assert store._loop_writes == {}
    assert store.get_request("p", "r1") is not None


async def test_aclose_finishes_the_loop_writes_under_way(opened: Callable[..., PostgresStore]) -> None:
    store = opened(loop_connections=1)
    writes = [asyncio.ensure_future(store.insert_alone(record(id=f"01{index:02}"))) for index in range(30)]
    await asyncio.sleep(0)
    await store.aclose()
    assert await asyncio.gather(*writes) == [None] * 30
    with pytest.raises(RuntimeError, match="closed"):
        await store.insert_alone(record(id="01Z"))


async def test_every_connection_plans_a_lookup_for_the_table_as_it_is_now(
    opened: Callable[..., PostgresStore], schema: tuple[str, str]
) -> None:
    """A lookup prepared and run on a nearly empty table, then run again after thousands of
    inserts, uses the primary key: no generic plan made for the empty table (a whole-table
    scan) is kept: the loop's read connections and the pool's run with custom plans."""
    store = opened(loop_connections=1)
    await store.insert_alone(record(id="01A"))
    assert await store.read_get("session", "01A") is not None
    setting = "SELECT current_setting('plan_cache_mode')"
    assert await store._loop_read([(setting, ())]) == [[("force_custom_plan",)]]
    assert store.execute(setting) == [("force_custom_plan",)]
    with raw(schema[0]) as conn:
        store._configure(conn)
        conn.execute(
            f"PREPARE lookup (text, text) AS {postgres._GET}".replace("%s", "$1", 1).replace("%s", "$2", 1)
        )
        for _ in range(10):
            conn.execute("EXECUTE lookup ('session', '01A')")
        conn.execute(
            "INSERT INTO records (kind, id, namespace, revision, create_time, update_time, body) "
            "SELECT 'session', 'B' || n, 'default', 1, 0, 0, '' FROM generate_series(1, 20000) AS n"
        )
        plan = "\n".join(row[0] for row in conn.execute("EXPLAIN EXECUTE lookup ('session', '01A')"))
    assert "Seq Scan" not in plan, plan
    assert "records_pkey" in plan, plan


# bad input -------------------------------------------------------------------------------


async def test_a_nul_character_is_the_callers_error_not_an_internal_one(pg_url: str) -> None:
    """PostgreSQL's text cannot hold U+0000: a label value, a looked-up name or an id with
    one is INVALID_PARAMS (SQLite keeps or misses them), never INTERNAL_ERROR."""
    client = ACPClient(LocalTransport(open_facade(pg_url), owns_facade=True))
    try:
        calls: list[tuple[str, dict[str, Any]]] = [
            ("session.create", {"labels": {"team": "a\x00b"}}),
            ("session.create", {"project": "p\x00"}),
            ("session.show", {"session_id": "01\x00"}),
            ("plan.status", {"plan_id": "\x00"}),
        ]
        for operation, params in calls:
            with pytest.raises(ACPError) as info:
                await client.call(operation, **params)
            assert info.value.code == "INVALID_PARAMS", (operation, info.value)
            assert info.value.details["reason"] == "NUL_CHARACTER"
        created = await client.call("session.create", title="a\x00b is body, not a column")
        assert isinstance(created, session_pb2.CreateSessionResponse)
    finally:
        await client.close()


def test_statements_the_wire_path_cannot_decode_go_through_psycopg(
    opened: Callable[..., PostgresStore],
) -> None:
    """facade/store/pg_wire.py runs the store's statements through libpq; a column type it
    does not decode (numeric) or a parameter it does not encode (a list of ints) is left to
    psycopg before anything runs, with the same answer."""
    store = opened()
    assert store.execute("SELECT 1.5::numeric, %s::text", ("x",)) == [(decimal.Decimal("1.5"), "x")]
    assert store.execute("SELECT %s::bigint[]", ([1, 2],)) == [([1, 2],)]
    assert store.execute("SELECT %s::text[], %s::float8, %s::bytea", (["a", 'b"\\'], 0.1, b"\x00\xff")) == [
        (["a", 'b"\\'], 0.1, b"\x00\xff")
    ]
    with pytest.raises(postgres.NulCharacterError):
        store.execute("SELECT %s::text[]", (["a\x00"],))


def test_an_error_on_the_wire_path_is_never_taken_for_its_fall_back(
    opened: Callable[..., PostgresStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wire path says "use psycopg" with a value (pg_wire.PSYCOPG), not an exception: a
    NotImplementedError raised on it (here by a decoder) reaches the caller instead of the
    statement quietly running again through psycopg."""

    def unfinished(raw: bytes) -> str:
        raise NotImplementedError("a decoder not written yet")

    monkeypatch.setitem(pg_wire.DECODERS, 25, unfinished)
    store = opened()
    with pytest.raises(NotImplementedError, match="not written yet"):
        store.execute("SELECT %s::text", ("x",))


SETTINGS = (
    "SELECT current_setting('synchronous_commit'), current_setting('transaction_isolation'), "
    "current_setting('transaction_read_only')"
)


@pytest.mark.parametrize("default", ["server", "off in the URL"])
async def test_the_live_connections_commit_durably_and_read_one_snapshot(
    schema: tuple[str, str], default: str
) -> None:
    """An acknowledged write is on disk (``synchronous_commit`` on: off, a crash of the server
    loses commits it acknowledged) and a read sees one snapshot (repeatable read): read back
    from the store's own connections, the thread ones and those each event loop drives, also
    where the URL (as a database's or the server's settings could) makes ``off`` the default."""
    url = schema[0]
    if default != "server":
        url = url.replace("options=-csearch_path", "options=-csynchronous_commit%3Doff%20-csearch_path")
        with raw(url) as conn:
            assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
    store = PostgresStore(url)
    try:
        await live_settings(store)
    finally:
        await store.aclose()


async def live_settings(store: PostgresStore) -> None:
    """Writes: synchronous_commit on, read committed, read-write. Reads (which commit
    nothing, so synchronous_commit does not matter): repeatable read, read only."""
    durable = ("on", "read committed", "off")
    snapshot = ("repeatable read", "on")
    assert tuple((await store.write(lambda _store: store.execute(SETTINGS)))[0]) == durable
    assert tuple((await store.read(lambda _store: store.execute(SETTINGS)))[0])[1:] == snapshot
    loop = asyncio.get_running_loop()
    for lane, expected in ((store._loop_reads(loop), snapshot), (store._loop_writes_of(loop), durable)):
        answer = await lane.run([(SETTINGS, ())])
        assert not isinstance(answer, pg_wire.Fallback), lane
        assert tuple(answer[0][0])[-len(expected) :] == expected, lane


async def test_a_lost_connection_is_an_outage_of_one_line(
    opened: Callable[..., PostgresStore], schema: tuple[str, str]
) -> None:
    """A restart ends every connection: what background work (the event follower, the plan
    leases) then catches is named an outage, one line they log instead of a 40-line
    traceback each poll; any other error is not (issue 29)."""
    store = opened(readers=1)
    ((pid,),) = await store.read(lambda _s: store.execute("SELECT pg_backend_pid()"))
    await asyncio.to_thread(terminate, schema[0], pid)
    # What the store raises for a lost connection (STORE_UNAVAILABLE, retryable), and the
    # driver's own error it stands for: both are an outage of one line.
    with pytest.raises(StoreDownError) as info:
        await store.read(lambda s: s.get("session", "01A"))
    outage = store.outage(info.value)
    assert outage is not None, (type(info.value).__mro__, info.value)
    assert outage.startswith("StoreDownError: server closed the connection"), outage
    assert "\n" not in outage
    lost = psycopg.DatabaseError("server closed the connection unexpectedly\n\tThis probably means ...")
    assert store.outage(lost) == "DatabaseError: server closed the connection unexpectedly"
    assert store.outage(StoreUnavailableError("cannot connect to postgresql://h/db: refused")) == (
        "cannot connect to postgresql://h/db: refused"
    )
    with pytest.raises(psycopg.errors.UndefinedTable) as undefined:
        await store.read(lambda _s: store.execute("SELECT * FROM no_such_table"))
    assert store.outage(undefined.value) is None
    assert store.outage(ValueError("a bug")) is None
