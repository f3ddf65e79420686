"""Durability: a writer killed with SIGKILL right after acknowledged writes loses none of them."""

from __future__ import annotations

import pathlib
import queue
import signal
import subprocess
import sys
import threading

from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import events_pb2
from tests.facade.store import crash_child

ACKS_BEFORE_KILL = 600
REPO = pathlib.Path(__file__).resolve().parents[3]


def _read_lines(stream: object, lines: queue.Queue[str | None]) -> None:
    assert hasattr(stream, "readline")
    for raw in iter(stream.readline, b""):
        lines.put(raw.decode().rstrip("\n"))
    lines.put(None)


def test_sigkill_after_acknowledged_writes_loses_nothing(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "crash.db"
    child = subprocess.Popen(
        [sys.executable, crash_child.__file__, str(db), "1000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_lines, args=(child.stdout, lines), daemon=True).start()
    acks: list[list[str]] = []
    try:
        assert lines.get(timeout=30) == "ready"
        while len(acks) < ACKS_BEFORE_KILL:
            line = lines.get(timeout=30)
            assert line is not None, child.stderr.read().decode() if child.stderr else ""
            acks.append(line.split())
        # Killed mid-stream: the child is still writing when the signal lands.
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
        if child.stdout:
            child.stdout.close()
        if child.stderr:
            child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    # Acks the pipe still held when the child died were acknowledged too.
    while (line := lines.get(timeout=30)) is not None:
        acks.append(line.split())

    store = SQLiteStore(db)
    try:
        records = [ack[1] for ack in acks if ack[0] == "record"]
        items = [ack[1] for ack in acks if ack[0] == "item"]
        events = {int(ack[1]): ack[2] for ack in acks if ack[0] == "event"}
        assert len(records) >= ACKS_BEFORE_KILL // 3
        for record_id in records:
            assert store.get("session", record_id) is not None, record_id
        for record_id in items:
            assert store.list_items("messages", record_id) != [], record_id
        stored = {e.sequence: e for e in store.read_events(0, len(events) + 10)}
        for sequence, record_id in events.items():
            assert stored[sequence].session_id == record_id
            assert events_pb2.Event.FromString(stored[sequence].body).log_record.message.startswith("write ")
        # Gap-free: every acknowledged sequence, and nothing in between, is there.
        assert sorted(events) == list(range(1, len(events) + 1))
        assert store.last_sequence() >= len(events)
    finally:
        store.close()
