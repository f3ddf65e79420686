"""Durability beyond ``kill -9``: the page cache survives a killed process but not a power
cut, so a crash test alone passes with ``synchronous=OFF``. These tests fail with it (or with
NORMAL, which in WAL mode fsyncs only at checkpoints): the write connection must run
``synchronous=FULL``, and, traced with strace, every acknowledged call must be preceded by an
fsync of the WAL that completed after the call began (its commit reached the disk)."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

from cleveragents.acp.facade.store.sqlite import SQLiteStore
from tests import needs
from tests.facade.store import crash_child

REPO = pathlib.Path(__file__).resolve().parents[3]
TIMEOUT = 120
# Calls the traced child makes (writers x calls each x 2): enough for grouped commits.
WRITERS, CALLS = 4, 10

_SYNC_START = re.compile(r"^(\d+)\s+f(?:data)?sync\((\d+)<([^>]*)>")
_RESUMED = re.compile(r"^(\d+)\s+<\.\.\. f(?:data)?sync resumed>.*= 0$")
_LINE = re.compile(r'^\d+\s+write\(1<[^>]*>, "(start|ack) ([^ \\"]+)')


def test_the_write_connection_runs_synchronous_full_in_wal_mode(db_path: pathlib.Path) -> None:
    store = SQLiteStore(db_path)
    try:
        with store.transaction():  # on the write connection
            assert store.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
            assert store.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        store.close()


def test_the_write_connection_keeps_rollback_journals_in_memory(db_path: pathlib.Path) -> None:
    """A savepoint's journal (one per write of a group commit) only undoes part of an open
    transaction: in a temporary file it cost three times the WAL's writes, for nothing a
    crash needs."""
    store = SQLiteStore(db_path)
    try:
        with store.transaction():
            assert store.execute("PRAGMA temp_store").fetchone()[0] == 2  # MEMORY
    finally:
        store.close()


def wal_syncs_before_acks(trace: list[str]) -> tuple[int, list[str]]:
    """(acks seen, the calls acknowledged with no WAL fsync completed since they began)."""
    completed = 0
    pending: set[str] = set()
    began: dict[str, int] = {}
    acks = 0
    unsynced: list[str] = []
    for line in trace:
        if start := _SYNC_START.match(line):
            if start.group(3).endswith("-wal"):
                if line.rstrip().endswith("= 0"):
                    completed += 1
                elif "<unfinished" in line:
                    pending.add(start.group(1))
        elif (resumed := _RESUMED.match(line)) and resumed.group(1) in pending:
            pending.discard(resumed.group(1))
            completed += 1
        elif said := _LINE.match(line):
            word, call = said.groups()
            if word == "start":
                began[call] = completed
            else:
                acks += 1
                if completed <= began.pop(call):
                    unsynced.append(call)
    return acks, unsynced


def test_every_acknowledged_call_follows_an_fsync_of_the_wal(tmp_path: pathlib.Path) -> None:
    """The only check that a commit reaches the disk: it must run in CI (tests/needs.py)."""
    strace = needs.program("strace")
    trace = tmp_path / "trace.txt"
    done = subprocess.run(
        [
            strace,
            "-f",
            "-y",
            "-qq",
            "-e",
            "trace=write,fsync,fdatasync",
            "-o",
            str(trace),
            sys.executable,
            crash_child.__file__,
            "traced",
            str(tmp_path / "acp.db"),
            str(CALLS),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    acks, unsynced = wal_syncs_before_acks(trace.read_text().splitlines())
    assert acks == WRITERS * CALLS * 2
    assert unsynced == []
