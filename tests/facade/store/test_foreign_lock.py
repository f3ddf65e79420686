"""Another process holding the SQLite write lock: reads go on, writes wait off the event
loop, then complete, or fail with STORE_BUSY after the bound having written nothing."""

from __future__ import annotations

import asyncio
import pathlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import session_pb2
from tests.server_process import Children

TIMEOUT = 30
# A loose bound: a read must not wait for the lock (seconds), yet not be timed tightly.
READ_BOUND = 1.0

LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
db.execute("INSERT INTO events (namespace, type, time, body) VALUES ('x', 'foreign', 0, x'')")
print("locked", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
"""


class Locker:
    """A real process holding the write lock until released (its transaction rolls back);
    the ``children`` fixture kills it if the test ends first."""

    def __init__(self, db: pathlib.Path, children: Children) -> None:
        self.process = children.popen(
            [sys.executable, "-c", LOCKER, str(db)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "locked"

    def release(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(timeout=TIMEOUT)


async def _client(
    db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, bound: str
) -> AsyncIterator[ACPClient]:
    monkeypatch.setenv("ACP_STORE_WRITE_TIMEOUT_SECONDS", bound)
    async with ACPClient(LocalTransport(open_facade(db_path), owns_facade=True)) as client:
        yield client


async def _session(client: ACPClient, title: str) -> str:
    created = await client.call("session.create", title=title)
    assert isinstance(created, session_pb2.CreateSessionResponse)
    return created.session.meta.id


async def _worst_read(client: ACPClient, session_id: str, until: asyncio.Future[str]) -> float:
    """The slowest session.show while ``until`` is pending (at least one)."""
    worst = 0.0
    while True:
        started = time.monotonic()
        shown = await client.call("session.show", session_id=session_id)
        worst = max(worst, time.monotonic() - started)
        assert isinstance(shown, session_pb2.GetSessionResponse)
        if until.done():
            return worst
        await asyncio.sleep(0.01)


async def test_reads_go_on_and_the_write_completes_once_the_lock_goes(
    db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, children: Children
) -> None:
    async for client in _client(db_path, monkeypatch, "30"):
        existing = await _session(client, "before")
        locker = Locker(db_path, children)
        write = asyncio.ensure_future(_session(client, "while locked"))
        # Reads answer while the write waits for the lock.
        reads = asyncio.ensure_future(_worst_read(client, existing, write))
        await asyncio.sleep(0.5)
        assert not write.done()
        await asyncio.to_thread(locker.release)
        created = await asyncio.wait_for(write, TIMEOUT)
        assert await asyncio.wait_for(reads, TIMEOUT) < READ_BOUND
        shown = await client.call("session.show", session_id=created)
        assert isinstance(shown, session_pb2.GetSessionResponse)
        assert shown.session.title == "while locked"


async def test_a_write_past_the_bound_fails_retryably_having_written_nothing(
    db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, children: Children
) -> None:
    async for client in _client(db_path, monkeypatch, "0.5"):
        existing = await _session(client, "before")
        locker = Locker(db_path, children)
        tell = client.call("session.tell", session_id=existing, content="hello")
        with pytest.raises(ACPError) as caught:
            await asyncio.wait_for(tell, TIMEOUT)
        error = caught.value
        assert (error.code, error.details["refinement"], error.details["retryable"]) == (
            "BUDGET_EXCEEDED",
            "STORE_BUSY",
            True,
        )
        assert "locked by another process" in error.message
        # Reads still answer while the lock is held.
        shown = await asyncio.wait_for(client.call("session.show", session_id=existing), READ_BOUND * 5)
        assert isinstance(shown, session_pb2.GetSessionResponse)
        assert list(shown.messages) == []
        await asyncio.to_thread(locker.release)
        # The same call again succeeds once the lock is gone; nothing of the first is there.
        told = await client.call("session.tell", session_id=existing, content="hello")
        assert isinstance(told, session_pb2.TellSessionResponse)
        shown = await client.call("session.show", session_id=existing)
        assert isinstance(shown, session_pb2.GetSessionResponse)
        assert shown.messages[0].content == "hello"
        assert sum(m.content == "hello" for m in shown.messages) == 1


# Holds every read mark of the WAL index exclusively (SQLite's unix VFS locks -shm bytes
# 120 + 3..7) for the seconds given: readers and openers find none to share.
MARK_HOLDER = """
import fcntl, os, sqlite3, sys, time
db = sqlite3.connect(sys.argv[1])
db.execute("SELECT count(*) FROM sqlite_master").fetchone()
fd = os.open(sys.argv[1] + "-shm", os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 5, 123)
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""
# Past SQLite's own retries (about 10 s), after which it answers SQLITE_PROTOCOL.
MARKS_HELD_SECONDS = 10.5


def test_an_open_beside_a_process_holding_the_wal_index_waits_it_out(
    db_path: pathlib.Path, children: Children
) -> None:
    """A process frozen inside SQLite's read-mark update (a SIGSTOP, a VM stall) makes
    SQLite answer "locking protocol" once its own retries run out; that is contention like
    "database is locked", so the opener keeps waiting within its bound, and opens."""
    SQLiteStore(db_path).close()
    holder = children.popen(
        [sys.executable, "-c", MARK_HOLDER, str(db_path), str(MARKS_HELD_SECONDS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "locked"
    started = time.monotonic()
    store = SQLiteStore(db_path, write_timeout=TIMEOUT)
    try:
        assert time.monotonic() - started >= MARKS_HELD_SECONDS - 1
        assert store.schema_version > 0
    finally:
        store.close()
