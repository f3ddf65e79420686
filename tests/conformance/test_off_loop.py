"""The event loop never touches storage: every scenario of the contract suite, served by the
real server, while every synchronous ``Store`` method reports a call made on the thread
running the event loop (the async code must go through ``await store.read/write``).

Beside the scenarios: a model actor's plan and a model orchestrator's session (their history
and text deltas), and a stream opened with a ticket. Opening the facade (migrations, restart
recovery) runs before the server serves and is not a call; closing the store is shutdown.
"""

from __future__ import annotations

import asyncio
import functools
import pathlib
import traceback
from collections.abc import Callable
from typing import Any

import pytest

from cleveragents.acp.facade.store.base import Store
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from tests.conformance import test_model_deltas
from tests.conformance.backends import open_backend
from tests.conformance.generated import SCENARIOS
from tests.conformance.harness import Run
from tests.server_process import Tokens

# Every synchronous method of the Store interface, and SQLiteStore's own statement runner.
GUARDED = [
    *sorted(
        name
        for name, value in vars(Store).items()
        if callable(value)
        and not name.startswith("_")
        and not asyncio.iscoroutinefunction(value)
        and name not in ("close", "observe")
    ),
    "execute",
]
# Frames where a synchronous call is not a call's: building the facade before it serves.
EXEMPT = ("open_facade",)
STORE_FILES = ("facade/store/",)


def _on_loop_thread() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _caller() -> str:
    """Where the loop touched storage: the product's frames outside the store, innermost
    first (the async function that should have awaited read/write is among them)."""
    frames = [
        f"{frame.filename.split('/acp/')[-1].split('/offloop/')[-1]}:{frame.lineno} ({frame.name})"
        for frame in reversed(traceback.extract_stack()[:-3])
        if not any(part in frame.filename for part in (*STORE_FILES, "test_off_loop.py"))
    ]
    product = [f for f in frames if f.startswith(("facade/", "gateway/", "contract/"))]
    return " <- ".join(product[:5]) or "?"


def _exempt() -> bool:
    return any(frame.name in EXEMPT for frame in traceback.extract_stack())


class Guard:
    def __init__(self) -> None:
        self.armed = False
        self.found: dict[str, str] = {}

    def wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            if self.armed and _on_loop_thread() and not _exempt():
                self.found.setdefault(_caller(), f"Store.{name}")
            return method(*args, **kwargs)

        return guarded


@pytest.fixture
def guard(monkeypatch: pytest.MonkeyPatch) -> Guard:
    found = Guard()
    for name in GUARDED:
        monkeypatch.setattr(SQLiteStore, name, found.wrap(name, getattr(SQLiteStore, name)))
    return found


def test_the_guard_sees_a_sync_call_on_the_loop(guard: Guard, tmp_path: pathlib.Path) -> None:
    """The guard itself: a synchronous read on the loop is reported, one on a store thread is not."""
    store = SQLiteStore(tmp_path / "acp.db")

    async def touch() -> None:
        guard.armed = True
        await store.read(lambda s: s.last_sequence())
        assert guard.found == {}
        store.last_sequence()

    try:
        asyncio.run(touch())
    finally:
        store.close()
    assert list(guard.found.values()) == ["Store.last_sequence"]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_no_scenario_touches_the_store_on_the_loop(
    name: str, guard: Guard, tmp_path: pathlib.Path, tokens: Tokens
) -> None:
    async with open_backend("http", tmp_path, tokens) as backend:
        guard.armed = True
        try:
            await SCENARIOS[name](Run(backend))
        finally:
            guard.armed = False
    assert guard.found == {}, _listed(guard)


def _listed(guard: Guard) -> str:
    return "synchronous store calls on the event loop:\n" + "\n".join(
        f"  {where}: {what}" for where, what in sorted(guard.found.items())
    )


async def test_model_plans_and_sessions_stay_off_the_loop(
    guard: Guard, tmp_path: pathlib.Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model orchestrator's tell (history, text deltas, start_plan) and a model actor's
    plan (turns, decisions, steps), with subscribers reading backlog and live events."""
    guard.armed = True
    await test_model_deltas.test_deltas_on_every_transport_and_none_for_a_1_1_subscriber(
        "http", tmp_path, tokens, monkeypatch
    )
    guard.armed = False
    assert guard.found == {}, _listed(guard)


async def test_stream_tickets_stay_off_the_loop(guard: Guard, tmp_path: pathlib.Path, tokens: Tokens) -> None:
    async with open_backend("http", tmp_path, tokens) as backend:
        client = backend.client()
        created = await client.call("session.create", title="ticketed")
        session_id = created.session.meta.id  # type: ignore[attr-defined]
        await client.call("session.tell", session_id=session_id, content="/help")
        guard.armed = True
        try:
            issued = await client.call("events.ticket", session_id=session_id)
            async with (
                backend.http_client() as http,
                http.stream(
                    "GET",
                    "/api/v1/events/stream",
                    params={"ticket": issued.ticket, "session_id": session_id},  # type: ignore[attr-defined]
                ) as answer,
            ):
                assert answer.status_code == 200
                async for line in answer.aiter_lines():
                    if line.startswith("event: session.message"):
                        break
        finally:
            guard.armed = False
    assert guard.found == {}, _listed(guard)
