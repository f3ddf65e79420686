"""SQLiteStore: the conformance suite, plus what only a file-backed store has: WAL,
reopening, and schema migrations on start."""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from cleveragents.acp.facade.store import migrations, sqlite
from cleveragents.acp.facade.store.base import SchemaTooNewError, Store
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from tests.facade.store.conformance import StoreConformance, event, record, reopen_keeps_everything


class TestSQLiteStore(StoreConformance):
    @pytest.fixture
    def store(self, db_path: pathlib.Path) -> Iterator[Store]:
        store = SQLiteStore(db_path)
        yield store
        store.close()


def test_new_file_is_created_in_wal_mode_at_the_latest_version(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "nested" / "dirs" / "acp.db"
    store = SQLiteStore(path)
    try:
        assert path.exists()
        assert store.schema_version == len(migrations.MIGRATIONS)
        assert store.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        store.close()


def test_reopen_keeps_everything(db_path: pathlib.Path) -> None:
    reopen_keeps_everything(lambda: SQLiteStore(db_path))


def test_old_database_is_upgraded_on_open(db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file written by a release that knew only migration 1 opens under a release that
    adds a step: the step runs once, and the old data is still there."""
    monkeypatch.setattr(sqlite, "MIGRATIONS", migrations.MIGRATIONS[:1])
    old = SQLiteStore(db_path)
    assert old.schema_version == 1
    old.insert(record(id="01A", name="alpha"))
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


def test_processes_opening_one_new_file_together_migrate_it_once(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "shared.db"
    code = (
        "import sys\n"
        "from cleveragents.acp.facade.store.sqlite import SQLiteStore\n"
        "SQLiteStore(sys.argv[1]).close()\n"
    )
    children = [
        subprocess.Popen([sys.executable, "-c", code, str(path)], stderr=subprocess.PIPE) for _ in range(4)
    ]
    for child in children:
        _, err = child.communicate(timeout=30)
        assert child.returncode == 0, err.decode()
    store = SQLiteStore(path)
    try:
        assert store.schema_version == len(migrations.MIGRATIONS)
    finally:
        store.close()


async def test_other_tasks_cannot_join_a_transaction_held_across_an_await(db_path: pathlib.Path) -> None:
    store = SQLiteStore(db_path)
    inside, release = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        with store.transaction():
            store.insert(record(id="01A"))
            inside.set()
            await release.wait()

    task = asyncio.create_task(holder())
    try:
        await asyncio.wait_for(inside.wait(), 10)
        misuses: list[Callable[[], object]] = [
            lambda: store.get("session", "01A"),
            lambda: store.insert(record(id="01B")),
            lambda: store.after_commit(lambda: None),
        ]
        for misuse in misuses:
            with pytest.raises(RuntimeError, match="across an await"):
                misuse()
        release.set()
        await asyncio.wait_for(task, 10)
        assert store.get("session", "01A") is not None
        assert store.get("session", "01B") is None
    finally:
        release.set()
        store.close()
