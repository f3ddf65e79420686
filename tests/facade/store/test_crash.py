"""Durability: a writer killed with SIGKILL right after acknowledged writes loses none of them."""

from __future__ import annotations

import asyncio
import pathlib
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncGenerator
from typing import IO, cast

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import events_pb2, session_pb2
from tests.facade.store import crash_child
from tests.server_process import Children

REPO = pathlib.Path(__file__).resolve().parents[3]
TIMEOUT = 30


def _pump(stream: IO[bytes], lines: queue.Queue[str | None]) -> None:
    """Pass on each complete line. A line cut short by the SIGKILL (the CI machine once
    delivered ``session`` without its id) was never acknowledged: the writer did not finish
    telling it, so it is dropped, as a client would drop half an answer."""
    for raw in iter(stream.readline, b""):
        if raw.endswith(b"\n"):
            lines.put(raw[:-1].decode())
    lines.put(None)


def write_then_kill(
    children: Children, mode: str, db: pathlib.Path, acks_before_kill: int
) -> list[list[str]]:
    """Run the writer, SIGKILL it once ``acks_before_kill`` writes were acknowledged (it is
    still writing then), and return every ack it printed. (The ``children`` fixture kills it
    if the test fails first.)"""
    child = children.popen(
        [sys.executable, crash_child.__file__, mode, str(db), "1000000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    assert child.stdout is not None
    assert child.stderr is not None
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(child.stdout, lines), daemon=True).start()
    acks: list[list[str]] = []
    assert lines.get(timeout=TIMEOUT) == "ready"
    while len(acks) < acks_before_kill:
        line = lines.get(timeout=TIMEOUT)
        assert line is not None, child.stderr.read().decode()
        acks.append(line.split())
        assert len(acks[-1]) >= 2, f"an ack without its id: {line!r}"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=TIMEOUT)
    assert child.returncode == -signal.SIGKILL
    # Acks still in the pipe when the child died were acknowledged too.
    while (line := lines.get(timeout=TIMEOUT)) is not None:
        acks.append(line.split())
        assert len(acks[-1]) >= 2, f"an ack without its id: {line!r}"
    return acks


def test_sigkill_after_acknowledged_store_writes_loses_nothing(
    tmp_path: pathlib.Path, children: Children
) -> None:
    db = tmp_path / "crash.db"
    acks = write_then_kill(children, "store", db, 600)
    store = SQLiteStore(db)
    try:
        records = [ack[1] for ack in acks if ack[0] == "record"]
        items = [ack[1] for ack in acks if ack[0] == "item"]
        events = {int(ack[1]): ack[2] for ack in acks if ack[0] == "event"}
        assert len(records) >= 200
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
    finally:
        store.close()


async def test_sigkill_after_acknowledged_acp_calls_loses_nothing(
    tmp_path: pathlib.Path, children: Children
) -> None:
    db = tmp_path / "crash.db"
    acks = await asyncio.to_thread(write_then_kill, children, "facade", db, 120)
    sessions = [ack[1] for ack in acks if ack[0] == "session"]
    told = {ack[1]: ack[2] for ack in acks if ack[0] == "tell"}
    assert len(sessions) >= 60
    async with ACPClient(LocalTransport(open_facade(db), owns_facade=True)) as client:
        for session_id in sessions:
            shown = await client.call("session.show", session_id=session_id)
            assert isinstance(shown, session_pb2.GetSessionResponse)
            contents = [m.content for m in shown.messages]
            if session_id in told:
                assert told[session_id] in contents
        for session_id, content in told.items():
            stream = cast(AsyncGenerator[events_pb2.Event, None], client.subscribe(session_id=session_id))
            try:
                first = await asyncio.wait_for(anext(stream), TIMEOUT)
                second = await asyncio.wait_for(anext(stream), TIMEOUT)
            finally:
                await stream.aclose()
            # ACP 1.3: the tell's turn started, then the user's message joined the history.
            assert first.type == "session.turn_started"
            assert first.session_turn_started.turn.message_id == second.session_message.message.id
            assert second.type == "session.message"
            assert second.session_message.message.content == content


async def test_sigkill_amid_concurrent_writers_loses_nothing_acknowledged(
    tmp_path: pathlib.Path, children: Children
) -> None:
    """Sixteen writers at once share commits (group commit); a SIGKILL in the middle still
    leaves every acknowledged session and message, and the event log without a gap."""
    db = tmp_path / "crash.db"
    acks = await asyncio.to_thread(write_then_kill, children, "concurrent", db, 300)
    sessions = [ack[1] for ack in acks if ack[0] == "session"]
    told = {ack[1]: ack[2] for ack in acks if ack[0] == "tell"}
    assert len(sessions) >= 150
    store = SQLiteStore(db)
    try:
        for session_id in sessions:
            assert store.get("session", session_id) is not None, session_id
        for session_id, content in told.items():
            history = [
                session_pb2.Message.FromString(body)
                for _, body in store.list_items("session.messages", session_id)
            ]
            assert content in [m.content for m in history], session_id
        logged = store.read_events(0, 1_000_000)
        assert [e.sequence for e in logged] == list(range(1, len(logged) + 1))
        # Each acknowledged tell published its message event.
        announced = {
            events_pb2.Event.FromString(e.body).session_message.message.content
            for e in logged
            if e.type == "session.message"
        }
        assert set(told.values()) <= announced
    finally:
        store.close()
