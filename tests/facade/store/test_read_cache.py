"""The SQLite store's reads answered from memory while nobody commits: the WAL-index
header they are kept under, the bounded cache, and the store answering exactly what a
statement would, whoever committed (this store, another connection, another process)."""

from __future__ import annotations

import asyncio
import os
import pathlib
import sqlite3
import subprocess
import sys
from typing import Any

import pytest

from cleveragents.acp.facade.store.read_cache import ReadCache
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.facade.store.wal_index import WalIndex
from tests.facade.store.conformance import record
from tests.facade.store.shm_locks import shm_read_lockers

# Another process's commit: the body of one record rewritten through plain sqlite3.
FOREIGN_UPDATE = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA busy_timeout=5000")
db.execute("UPDATE records SET body = ? WHERE id = ?", (sys.argv[3].encode(), sys.argv[2]))
db.close()
"""


def foreign_update(path: pathlib.Path, id: str, body: str) -> None:
    subprocess.run([sys.executable, "-c", FOREIGN_UPDATE, str(path), id, body], check=True, timeout=60)


class Counted:
    """Counts the statements a store's reader threads make for point reads."""

    def __init__(self, store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads = 0
        inner = store._read_points

        def counted(reads: list[Any]) -> Any:
            self.reads += len(reads)
            return inner(reads)

        monkeypatch.setattr(store, "_read_points", counted)


@pytest.fixture
def store(tmp_path: pathlib.Path) -> Any:
    opened = SQLiteStore(tmp_path / "acp.db")
    yield opened
    opened.close()


# the WAL-index header -------------------------------------------------------------------


def test_the_header_changes_at_each_commit_of_any_connection_and_only_then(
    store: SQLiteStore,
) -> None:
    index = WalIndex(store.path)
    try:
        first = index.state()
        assert first is not None
        assert index.state() == first
        store.get("session", "nothing")  # a read commits nothing
        assert index.state() == first
        store.insert(record(id="01a"))
        second = index.state()
        assert second not in (None, first)
        foreign_update(store.path, "01a", "other")
        third = index.state()
        assert third not in (None, first, second)
        # A transaction rolled back changes nothing anyone can read.
        other = sqlite3.connect(str(store.path), isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE records SET body = x'00'")
        other.execute("ROLLBACK")
        other.close()
        assert index.state() == third
    finally:
        index.close()


def test_an_unreadable_header_is_unknown(tmp_path: pathlib.Path) -> None:
    """No -shm file, one too short, copies that differ (a writer midway), or an index not
    built yet: None, so nothing is answered from memory."""
    database = tmp_path / "x.db"
    shm = tmp_path / "x.db-shm"

    def state() -> bytes | None:
        index = WalIndex(database)
        try:
            return index.state()
        finally:
            index.close()

    assert state() is None
    shm.write_bytes(b"\x01" * 40)
    assert state() is None
    header = bytearray(48)
    header[12] = 1
    shm.write_bytes(bytes(header) + bytes(header[:47]) + b"\x09")
    assert state() is None
    header[12] = 0
    shm.write_bytes(bytes(header) * 2)
    assert state() is None
    header[12] = 1
    shm.write_bytes(bytes(header) * 2)
    index = WalIndex(database)
    assert index.state() == bytes(header)
    index.close()
    assert index.state() is None


def test_the_index_keeps_sqlite_s_lock_on_shm_while_any_store_of_the_process_is_open(
    tmp_path: pathlib.Path,
) -> None:
    """Closing any descriptor of -shm drops every POSIX lock the process holds on it; the
    index keeps one descriptor per file per process, closed after the last store's
    connections, so another process opening the file never finds itself alone and
    truncates -shm under the mapping (SIGBUS)."""
    path = tmp_path / "acp.db"
    first = SQLiteStore(path)
    assert os.getpid() in shm_read_lockers(path)
    second = SQLiteStore(path)
    looking = WalIndex(path)
    looking.close()
    assert os.getpid() in shm_read_lockers(path)
    first.close()
    assert os.getpid() in shm_read_lockers(path)
    # Another process opening the file leaves -shm as it is: its header is still there.
    foreign_update(path, "none", "x")
    still = WalIndex(path)
    assert still.state() is not None
    still.close()
    second.close()


def test_no_other_connection_can_take_the_file_out_of_wal_mode_while_the_store_is_open(
    store: SQLiteStore,
) -> None:
    """What keeps the mapping safe and meaningful: while the store is open, its connection
    holds the -shm file (nobody truncates it) and the file stays in WAL mode."""
    other = sqlite3.connect(str(store.path), isolation_level=None, timeout=0.1)
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("PRAGMA journal_mode=DELETE")
    finally:
        other.close()
    assert store.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


# the cache ---------------------------------------------------------------------------


class FixedIndex(WalIndex):
    def __init__(self) -> None:
        self.now: bytes | None = b"a"

    def state(self) -> bytes | None:
        return self.now


def test_answers_are_kept_under_the_header_seen_before_they_were_read() -> None:
    index = FixedIndex()
    cache: ReadCache[str] = ReadCache(index)
    state = cache.look()
    assert cache.get(state, "k") == (False, None)
    cache.put(state, "k", "v", 10)
    assert cache.get(cache.look(), "k") == (True, "v")
    # A commit: the next look drops everything.
    index.now = b"b"
    assert cache.get(cache.look(), "k") == (False, None)
    # An answer asked for before that commit is not kept under the new header.
    cache.put(state, "k", "old", 10)
    assert cache.get(cache.look(), "k") == (False, None)
    # Unknown header: nothing kept, nothing answered.
    index.now = None
    unknown = cache.look()
    cache.put(unknown, "k", "v", 10)
    assert cache.get(unknown, "k") == (False, None)


def test_the_cache_is_bounded_in_entries_and_bytes_and_keeps_the_recently_used() -> None:
    cache: ReadCache[int] = ReadCache(FixedIndex(), entries=3, size=1000)
    state = cache.look()
    for n in range(3):
        cache.put(state, n, n, 10)
    assert cache.get(state, 0) == (True, 0)  # 0 used last: 1 is dropped first
    cache.put(state, 3, 3, 10)
    assert [cache.get(state, n)[0] for n in range(4)] == [True, False, True, True]

    cache = ReadCache(FixedIndex(), entries=100, size=100, largest=60)
    state = cache.look()
    cache.put(state, "big", 0, 61)  # larger than any answer kept
    assert cache.get(state, "big") == (False, None)
    for n in range(4):
        cache.put(state, n, n, 20)
    cache.put(state, "60", 60, 60)  # 4 * 20 + 60 > 100: the two least recent go
    assert [cache.get(state, key)[0] for key in (0, 1, 2, 3, "60")] == [False, False, True, True, True]
    cache.put(state, "60", 60, 20)  # an answer kept again counts once
    cache.put(state, 4, 4, 20)
    assert [cache.get(state, key)[0] for key in (2, 3, "60", 4)] == [True, True, True, True]


# the store ---------------------------------------------------------------------------


async def test_a_read_asked_again_while_nobody_commits_needs_no_reader_thread(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.insert(record(id="01a", body=b"one", labels={"team": "x"}))
    store.append_items("messages", "01a", [b"m0", b"m1"])
    counted = Counted(store, monkeypatch)
    first = await store.read_with_items("session", "01a", "messages")
    again = await store.read_with_items("session", "01a", "messages")
    assert again == first == (store.get("session", "01a"), [(0, b"m0"), (1, b"m1")])
    assert counted.reads == 1
    assert await store.read_get("session", "01a") == first[0]
    assert await store.read_get("session", "01a") == first[0]
    assert await store.read_get("session", "none") is None
    assert await store.read_get("session", "none") is None
    assert counted.reads == 3
    store.insert(record(id="01b", name="named"))
    lane = store._reads.run
    asked: list[object] = []

    async def run(call: Any, **kw: Any) -> Any:
        asked.append(call)
        return await lane(call, **kw)

    monkeypatch.setattr(store._reads, "run", run)
    by_name = await store.read_get_by_name("session", "default", "named")
    assert by_name == store.get("session", "01b")
    assert await store.read_get_by_name("session", "default", "named") == by_name
    assert await store.read_get_by_name("session", "other", "named") is None
    assert len(asked) == 2


async def test_what_a_caller_changes_in_an_answer_is_not_what_the_next_caller_gets(
    store: SQLiteStore,
) -> None:
    store.insert(record(id="01a", labels={"team": "x"}))
    shown = await store.read_get("session", "01a")
    assert shown is not None
    shown.labels["team"] = "changed"
    shown.attrs["k"] = "v"
    shown.revision = 99
    again = await store.read_get("session", "01a")
    assert again == store.get("session", "01a")
    assert again is not None
    assert again.labels == {"team": "x"}
    items = (await store.read_with_items("session", "01a", "messages"))[1]
    items.append((7, b"x"))
    assert (await store.read_with_items("session", "01a", "messages"))[1] == []


async def test_every_commit_of_this_store_or_another_process_is_read_at_once(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.insert(record(id="01a", body=b"one"))
    assert (await store.read_get("session", "01a")).body == b"one"  # type: ignore[union-attr]
    await store.write(lambda s: s.append_items("messages", "01a", [b"m"]))
    assert (await store.read_with_items("session", "01a", "messages"))[1] == [(0, b"m")]
    foreign_update(store.path, "01a", "three")
    assert (await store.read_get("session", "01a")).body == b"three"  # type: ignore[union-attr]
    assert (await store.read_with_items("session", "01a", "messages"))[0].body == b"three"  # type: ignore[union-attr]
    store.insert(record(id="01b", name="named", body=b"one"))
    assert (await store.read_get_by_name("session", "default", "named")).body == b"one"  # type: ignore[union-attr]
    foreign_update(store.path, "01b", "four")
    assert (await store.read_get("session", "01a")).body == b"three"  # type: ignore[union-attr]
    assert (await store.read_get_by_name("session", "default", "named")).body == b"four"  # type: ignore[union-attr]


async def test_a_commit_while_a_read_is_on_its_way_is_not_hidden_by_it(
    store: SQLiteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The answer read around another's commit is kept under the header seen before it
    was asked for, so the next look (which sees the commit) drops it."""
    store.insert(record(id="01a", body=b"one"))
    inner = store._read_points
    commits = iter(["two"])

    def commit_then_read(reads: list[Any]) -> Any:
        answers = inner(reads)  # read the old body...
        for body in commits:
            foreign_update(store.path, "01a", body)  # ...then someone commits
        return answers

    monkeypatch.setattr(store, "_read_points", commit_then_read)
    assert (await store.read_get("session", "01a")).body == b"one"  # type: ignore[union-attr]
    assert (await store.read_get("session", "01a")).body == b"two"  # type: ignore[union-attr]


async def test_reads_in_many_tasks_at_once_each_get_their_own_answer(store: SQLiteStore) -> None:
    for n in range(20):
        store.insert(record(id=f"01{n:02}", body=bytes([n])))
    for _ in range(3):
        answers = await asyncio.gather(*(store.read_get("session", f"01{n % 20:02}") for n in range(60)))
        assert [a.body if a else None for a in answers] == [bytes([n % 20]) for n in range(60)]


def test_a_store_told_not_to_cache_reads_every_time(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteStore(tmp_path / "acp.db", cache_reads=False)
    try:
        store.insert(record(id="01a"))
        counted = Counted(store, monkeypatch)

        async def twice() -> None:
            await store.read_get("session", "01a")
            await store.read_get("session", "01a")

        asyncio.run(twice())
        assert counted.reads == 2
        assert store._cache is None
    finally:
        store.close()


def test_a_closed_store_reads_nothing_from_memory(tmp_path: pathlib.Path) -> None:
    store = SQLiteStore(tmp_path / "acp.db")
    store.insert(record(id="01a"))

    async def read() -> Any:
        return await store.read_get("session", "01a")

    assert asyncio.run(read()) is not None
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(read())


def test_loops_on_two_threads_at_once_share_no_cache(store: SQLiteStore) -> None:
    """The cache has no lock: the first loop uses it, reads on another loop running beside
    it go to the readers, and a loop that comes after the first is closed takes it over."""
    store.insert(record(id="01a", body=b"one"))

    async def read() -> Any:
        return await store.read_get("session", "01a")

    first = asyncio.new_event_loop()
    try:
        assert first.run_until_complete(read()).body == b"one"
        assert store._cache_loop is first
        assert asyncio.run(read()).body == b"one"  # beside it: not its cache
        assert store._cache_loop is first
    finally:
        first.close()
    assert asyncio.run(read()).body == b"one"
    assert store._cache_loop is not first
