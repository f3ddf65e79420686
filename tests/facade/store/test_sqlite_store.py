"""SQLiteStore: what only the file-backed store has (WAL, schema migrations on start, its
list plans); the conformance suite runs in test_conformance.py."""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable
from typing import Any

import pytest

from cleveragents.acp.facade.store import migrations, sqlite, sqlite_reads
from cleveragents.acp.facade.store.base import EventFilter, ListQuery, SchemaTooNewError, StoreBusyError
from cleveragents.acp.facade.store.requests import CLAIM, Claim, RequestEntry
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from tests.facade.store.conformance import event, record
from tests.server_process import Children


def test_new_file_is_created_in_wal_mode_at_the_latest_version(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "nested" / "dirs" / "acp.db"
    store = SQLiteStore(path)
    try:
        assert path.exists()
        assert store.schema_version == len(migrations.MIGRATIONS)
        assert store.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        store.close()


def test_a_new_file_and_its_wal_and_shm_are_the_servers_alone(tmp_path: pathlib.Path) -> None:
    """Issue 31, finding 10: database files were created 0644, so a command running as
    another user (--command-user) could read every session when --db sat in a readable
    folder. A file that already exists keeps the mode its owner gave it."""
    path = tmp_path / "new" / "acp.db"
    store = SQLiteStore(path)
    try:
        store.insert(record("a"))
        for name in ("acp.db", "acp.db-wal", "acp.db-shm"):
            assert stat.S_IMODE((path.parent / name).stat().st_mode) == 0o600, name
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    finally:
        store.close()
    shared = tmp_path / "shared.db"
    sqlite3.connect(shared).close()
    shared.chmod(0o640)
    SQLiteStore(shared).close()
    assert stat.S_IMODE(shared.stat().st_mode) == 0o640


def test_old_database_is_upgraded_on_open(db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file written by a release that knew only migration 1 opens under a release that
    adds a step: the step runs once, and the old data is still there."""
    monkeypatch.setattr(sqlite, "MIGRATIONS", migrations.MIGRATIONS[:1])
    old = SQLiteStore(db_path)
    assert old.schema_version == 1
    # What that release wrote: its records table only (today's code also writes record_tags).
    with old.transaction():  # statements outside one run on a read-only connection
        old.execute(
            "INSERT INTO records (kind, id, namespace, name, revision, state, attrs, labels, create_time, "
            "update_time, body) VALUES ('session', '01A', 'default', 'alpha', 1, 'active', "
            """'{"project":"p"}', '{"team":"x"}', 0, 0, X'00')"""
        )
    old.append_events([event(plan_id="p1")])
    old.close()

    upgrade = """
        ALTER TABLE records ADD COLUMN probe TEXT NOT NULL DEFAULT 'upgraded';
        CREATE TABLE upgrade_marker (note TEXT NOT NULL);
        CREATE TRIGGER note_new_records AFTER INSERT ON records BEGIN
            INSERT INTO upgrade_marker VALUES ('record; added');
        END;
        INSERT INTO upgrade_marker VALUES ('ran; once')
    """
    monkeypatch.setattr(sqlite, "MIGRATIONS", (*migrations.MIGRATIONS, upgrade))
    new = SQLiteStore(db_path)
    try:
        assert new.schema_version == len(migrations.MIGRATIONS) + 1
        assert new.get("session", "01A") is not None
        assert new.execute("SELECT probe FROM records WHERE id='01A'").fetchone()[0] == "upgraded"
        # Migration 2 indexed what lists filter on for the records already there.
        for query in (
            ListQuery("session", state="active"),
            ListQuery("session", attrs={"project": "p"}),
            ListQuery("session", frozenset({"default"}), labels={"team": "x"}),
        ):
            assert [r.id for r in new.query(query)] == ["01A"], query
        assert [e.sequence for e in new.read_events(0, 10)] == [1]
        assert new.append_events([event()]) == [2]
    finally:
        new.close()
    again = SQLiteStore(db_path)
    try:
        again.insert(record(id="01B"))
        notes = [row[0] for row in again.execute("SELECT note FROM upgrade_marker ORDER BY rowid")]
        assert notes == ["ran; once", "record; added"]
    finally:
        again.close()


def test_failed_migration_leaves_the_file_at_its_old_version(
    db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    SQLiteStore(db_path).close()
    broken = "CREATE TABLE half_done (x INTEGER); INSERT INTO no_such_table VALUES (1)"
    monkeypatch.setattr(sqlite, "MIGRATIONS", (*migrations.MIGRATIONS, broken))
    with pytest.raises(sqlite3.OperationalError):
        SQLiteStore(db_path)
    monkeypatch.setattr(sqlite, "MIGRATIONS", migrations.MIGRATIONS)
    store = SQLiteStore(db_path)
    try:
        assert store.schema_version == len(migrations.MIGRATIONS)
        tables = {row[0] for row in store.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert "half_done" not in tables
    finally:
        store.close()


def test_database_from_a_newer_release_is_refused(db_path: pathlib.Path) -> None:
    SQLiteStore(db_path).close()
    raw = sqlite3.connect(db_path)
    raw.execute(f"PRAGMA user_version={len(migrations.MIGRATIONS) + 5}")
    raw.close()
    with pytest.raises(SchemaTooNewError, match="schema version"):
        SQLiteStore(db_path)


def test_a_new_file_another_connection_is_writing_is_opened_once_it_commits(tmp_path: pathlib.Path) -> None:
    """Switching a file to WAL needs its exclusive lock, and SQLite refuses at once, without
    its busy handler, while another connection's write transaction is open on a new
    (rollback-journal) file: the race of processes opening one new file together. The
    store tries again until the write bound instead of failing."""
    path = tmp_path / "new.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("CREATE TABLE theirs (x)")
    other.execute("BEGIN IMMEDIATE")
    timer = threading.Timer(0.3, lambda: other.execute("COMMIT"))
    timer.start()
    started = time.monotonic()
    try:
        store = SQLiteStore(path, write_timeout=10)
    finally:
        timer.join()
        other.close()
    try:
        assert time.monotonic() - started >= 0.25
        assert store.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert store.schema_version == len(migrations.MIGRATIONS)
    finally:
        store.close()


def test_a_new_file_locked_past_the_write_bound_is_refused(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "new.db"
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("CREATE TABLE theirs (x)")
    other.execute("BEGIN IMMEDIATE")
    started = time.monotonic()
    try:
        with pytest.raises(StoreBusyError) as busy:
            SQLiteStore(path, write_timeout=0.3)
        assert 0.3 <= time.monotonic() - started < 5
        assert busy.value.details["retryable"] is True
    finally:
        other.close()


def test_processes_opening_one_new_file_together_migrate_it_once(
    tmp_path: pathlib.Path, children: Children
) -> None:
    path = tmp_path / "shared.db"
    code = (
        "import sys\n"
        "from cleveragents.acp.facade.store.sqlite import SQLiteStore\n"
        "SQLiteStore(sys.argv[1]).close()\n"
    )
    started = [
        children.popen([sys.executable, "-c", code, str(path)], stderr=subprocess.PIPE) for _ in range(4)
    ]
    for child in started:
        _, err = child.communicate(timeout=30)
        assert child.returncode == 0, err.decode()
    store = SQLiteStore(path)
    try:
        assert store.schema_version == len(migrations.MIGRATIONS)
    finally:
        store.close()


def _steps_for_first_pages(store: SQLiteStore, count: int) -> dict[str, int]:
    """SQLite VM instructions (in hundreds) each filtered first page takes over ``count``
    sessions whose few matches are the oldest rows."""
    with store.transaction():
        for i in range(count):
            few = i < 3
            store.insert(
                record(
                    id=f"{i:08d}",
                    namespace="default" if i % 10 else "other",
                    state="closed" if few else "active",
                    attrs={"project": "rare" if few else "common"},
                    labels={"team": "rare" if few else "common"},
                )
            )
    queries = {
        "unfiltered": ListQuery("session"),
        "namespace": ListQuery("session", frozenset({"default"})),
        "namespaces": ListQuery("session", frozenset({"default", "other"})),
        "state": ListQuery("session", frozenset({"default", "other"}), state="closed"),
        "attr": ListQuery("session", frozenset({"default"}), attrs={"project": "rare"}),
        "attr_none": ListQuery("session", None, attrs={"project": "none"}),
        "labels": ListQuery("session", frozenset({"default"}), labels={"team": "rare"}),
        "by_name": ListQuery("session", None, by_name=True, labels={"team": "none"}),
    }
    steps = {}
    for name, query in queries.items():
        ticks = [0]

        def tick(ticks: list[int] = ticks) -> int:
            ticks[0] += 1
            return 0

        store._db.set_progress_handler(tick, 100)
        store.query(query)
        store._db.set_progress_handler(None, 100)
        steps[name] = ticks[0]
    return steps


def test_a_filtered_first_page_reads_about_the_page_not_the_store(tmp_path: pathlib.Path) -> None:
    """Counted in SQLite VM instructions, not timed: ten times the rows, the same work."""
    small, big = SQLiteStore(tmp_path / "small.db"), SQLiteStore(tmp_path / "big.db")
    try:
        at_small, at_big = _steps_for_first_pages(small, 500), _steps_for_first_pages(big, 5000)
    finally:
        small.close()
        big.close()
    for name, steps in at_big.items():
        assert steps <= at_small[name] * 1.5 + 5, (name, at_small[name], steps)


def _steps_to_resume(store: SQLiteStore, count: int) -> dict[str, int]:
    """VM instructions (in hundreds) to read a session's and a plan's events from sequence 0
    in a log of ``count`` events where nearly all belong to others (theirs are the newest)."""
    store.append_events([event(plan_id=f"p{i % 50}", session_id=f"s{i % 50}") for i in range(count)])
    store.append_events([event(plan_id="mine"), event(session_id="mine")])
    steps = {}
    for name, where in {
        "plan": EventFilter(plan_id="mine"),
        "session": EventFilter(session_id="mine"),
    }.items():
        ticks = [0]

        def tick(ticks: list[int] = ticks) -> int:
            ticks[0] += 1
            return 0

        store._db.set_progress_handler(tick, 100)
        assert len(store.read_events(0, 256, where)) == 1
        store._db.set_progress_handler(None, 100)
        steps[name] = ticks[0]
    return steps


def test_resuming_one_session_or_plan_from_0_reads_its_events_not_the_log(tmp_path: pathlib.Path) -> None:
    small, big = SQLiteStore(tmp_path / "small.db"), SQLiteStore(tmp_path / "big.db")
    try:
        at_small, at_big = _steps_to_resume(small, 200), _steps_to_resume(big, 20_000)
    finally:
        small.close()
        big.close()
    for name, steps in at_big.items():
        assert steps <= at_small[name] * 1.5 + 5, (name, at_small[name], steps)


async def _asleep(store: SQLiteStore) -> None:
    """Until the writer thread waits for work."""
    await store.write(lambda s: None)
    for _ in range(5000):
        if store._sleeping:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("the writer never went to sleep")


def _blocking_io() -> None:
    """What a socket read does to the other threads: lets go of the GIL for a while."""
    time.sleep(0.002)


async def test_writes_one_turn_of_the_loop_asks_for_share_the_sleeping_writers_commit(
    tmp_path: pathlib.Path,
) -> None:
    """Each call lets go of the GIL before its write: woken by the first, the writer would
    take that one alone to its commit, and the next alone to the next."""
    store = SQLiteStore(tmp_path / "acp.db")
    commits: list[float] = []

    class Recorder:
        def committed(self, seconds: float) -> None:
            commits.append(seconds)

        def waited(self, access: str, seconds: float) -> None:
            pass

    async def call(index: int) -> None:
        _blocking_io()
        await store.write(lambda s: s.insert(record(id=f"01{index}")))

    try:
        await _asleep(store)
        store.observe(Recorder())
        await asyncio.gather(*(call(index) for index in range(8)))
        assert len(commits) == 1
        assert len(store.query(ListQuery("session", None))) == 8
    finally:
        store.close()


async def test_the_inserts_of_one_commit_are_a_few_statements_together(tmp_path: pathlib.Path) -> None:
    """Each statement costs the writer GIL hand-offs with a busy loop: the inserts one
    commit takes are one savepoint with one statement for their records, one for their
    tags and one per request row, whatever their number; one write alone has no savepoint."""
    store = SQLiteStore(tmp_path / "acp.db")
    statements: list[str] = []
    claim = Claim(RequestEntry("alice", "r-1", "session.create", b"\x01" * 32, "owner-1", 1000.0), cutoff=0.0)

    async def insert(index: int) -> None:
        if index == 3:
            CLAIM.set(claim)
        await store.insert_alone(record(id=f"01{index}", state="active", labels={"k": str(index)}))

    try:
        await _asleep(store)
        store._db.set_trace_callback(statements.append)
        await asyncio.gather(*(insert(index) for index in range(8)))
        verbs = [" ".join(statement.split()[:3]) for statement in statements]
        assert verbs == [
            "BEGIN IMMEDIATE",
            "SAVEPOINT together",
            "INSERT INTO records",
            "INSERT OR IGNORE",
            "INSERT INTO requests",
            "RELEASE together",
            "COMMIT",
        ]
        assert statements[2].count("'01") == 8
        assert len(store.query(ListQuery("session", None, state="active"))) == 8
        assert [found.id for found in store.query(ListQuery("session", None, labels={"k": "5"}))] == ["015"]
        stamped = store.get_request("alice", "r-1")
        assert stamped is not None
        assert stamped.written == {("session", "013"): b"body-013"}
        await _asleep(store)
        statements.clear()
        await store.insert_alone(record(id="01Z"))
        await store.write(lambda s: s.update(record(id="01Z", state="closed")))
        assert [statement.split()[0] for statement in statements] == [
            *("BEGIN", "INSERT", "COMMIT"),
            *("BEGIN", "SELECT", "UPDATE", "INSERT", "COMMIT"),
        ]
    finally:
        store.close()


async def test_a_loop_that_never_runs_out_of_work_holds_the_writer_back_only_briefly(
    tmp_path: pathlib.Path,
) -> None:
    store = SQLiteStore(tmp_path / "acp.db")
    loop = asyncio.get_running_loop()
    spinning = True

    def spin() -> None:
        if spinning:
            loop.call_soon(spin)

    try:
        await _asleep(store)
        spin()
        await asyncio.wait_for(store.write(lambda s: s.insert(record())), 5)
        assert store.get("session", "01A") is not None
    finally:
        spinning = False
        store.close()


async def test_point_reads_one_turn_of_the_loop_asks_for_are_one_statement(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader answers the point reads it takes at once with one statement (each
    statement costs it GIL hand-offs with the loop). When that statement fails (here their
    answers together exceed SQLite's length limit, though each fits alone), each read is
    made alone: none fails for sharing a statement."""
    store = SQLiteStore(tmp_path / "acp.db", cache_reads=False)
    try:
        for n in range(5):
            store.insert(record(id=f"01{n}", body=bytes([n]) * 300))
        store.append_items("messages", "012", [b"m"])
        statements: list[int] = []
        points = store._points

        def counted(reads: list[Any]) -> Any:
            statements.append(len(reads))
            return points(reads)

        monkeypatch.setattr(store, "_points", counted)

        def ask() -> Awaitable[list[Any]]:
            return asyncio.gather(
                *(store.read_get("session", f"01{n}") for n in range(5)),
                store.read_with_items("session", "012", "messages"),
            )

        expected: list[Any] = [store.get("session", f"01{n}") for n in range(5)]
        expected.append((store.get("session", "012"), [(0, b"m")]))
        assert await ask() == expected
        assert statements == [6]

        reader = store._reader

        def limited() -> sqlite3.Connection:
            db = reader()
            db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 1500)
            return db

        monkeypatch.setattr(store, "_reader", limited)
        together = [sqlite_reads.PointRead(counted, "session", f"01{n}", None, 0.0) for n in range(5)]
        with pytest.raises(sqlite3.DataError, match="too big"):
            await asyncio.to_thread(points, together)
        assert await ask() == expected
        assert statements == [6, 6]
    finally:
        store.close()


def test_a_server_on_sqlite_never_imports_psycopg(tmp_path: pathlib.Path) -> None:
    """psycopg is about 10 MiB of resident memory the embedded default never uses: the
    server's modules, and a facade opened on a SQLite file, leave it unimported."""
    script = (
        "import asyncio, sys\n"
        "import cleveragents.acp.gateway.assembly\n"
        "from cleveragents.acp.facade.factory import open_facade\n"
        "facade = open_facade(sys.argv[1])\n"
        "asyncio.run(facade.close())\n"
        "assert 'psycopg' not in sys.modules, 'psycopg imported'\n"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "acp.db")], check=True, timeout=120)
