"""A stopping server cuts the calls still running at the end of its grace period
(``ServiceFacade.cut``, issue 30 item 6): each is answered INVALID_STATE ``SERVER_STOPPING``
saying whether it took effect, read from its request id's row once its writes settled, and
retryable only when it did not. Real SQLite file; another connection holds the write lock so
the call is in flight at a known step (its write queued)."""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import session_pb2
from tests.facade.test_idempotency import CREATE, call, sessions


def _spy_writes(store: SQLiteStore, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """Set once a write is queued (the caller then waits for it on the write lock)."""
    queued = asyncio.Event()
    original: Callable[[Any], Awaitable[Any]] = store.write

    async def write(fn: Any) -> Any:
        queued.set()
        return await original(fn)

    monkeypatch.setattr(store, "write", write)
    return queued


async def _cut_while_queued(
    facade: ServiceFacade, holder: sqlite3.Connection, queued: asyncio.Event, *, release: bool
) -> ACPError:
    request = session_pb2.CreateSessionRequest(title="cut")
    running = asyncio.ensure_future(call(facade, CREATE, request, "cut-1"))
    await queued.wait()
    assert facade.cut() == 1
    if release:
        holder.execute("ROLLBACK")
    with pytest.raises(ACPError) as cut:
        await running
    return cut.value


async def test_a_cut_call_whose_write_committed_says_applied(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "acp.db"
    facade = open_facade(db)
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        assert facade.idempotency is not None
        store = facade.idempotency.store
        assert isinstance(store, SQLiteStore)
        queued = _spy_writes(store, monkeypatch)
        holder.execute("BEGIN IMMEDIATE")
        err = await _cut_while_queued(facade, holder, queued, release=True)
        assert (err.code, err.details["refinement"]) == ("INVALID_STATE", "SERVER_STOPPING")
        assert err.details["effect"] == "applied"
        assert err.details["retryable"] is False
        assert err.details["request_id"] == "cut-1"
        # The effect happened once; the retry is answered from the stamp, nothing twice.
        facade.idempotency.cutting = False
        again = session_pb2.CreateSessionRequest(title="cut")
        response, replayed = await call(facade, CREATE, again, "cut-1")
        assert replayed
        assert [s.meta.id for s in await sessions(facade)] == [response.session.meta.id]  # type: ignore[attr-defined]
    finally:
        holder.close()
        await facade.close()


async def test_a_cut_call_whose_write_failed_says_none_and_is_retryable(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "acp.db"
    facade = open_facade(db)
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        assert facade.idempotency is not None
        store = facade.idempotency.store
        assert isinstance(store, SQLiteStore)
        store.write_timeout = 2.0
        queued = _spy_writes(store, monkeypatch)
        holder.execute("BEGIN IMMEDIATE")
        # The lock is never released: the queued write fails (STORE_BUSY) after the cut.
        err = await _cut_while_queued(facade, holder, queued, release=False)
        assert err.details["refinement"] == "SERVER_STOPPING"
        assert err.details["effect"] == "none"
        assert err.details["retryable"] is True
        holder.execute("ROLLBACK")
        assert await sessions(facade) == []
    finally:
        holder.close()
        await facade.close()


async def test_a_cut_read_says_none() -> None:
    """A call outside a request id's run (a read) is cut as well: it did nothing."""
    held = asyncio.Event()

    async def stalled(request: Any, ctx: Any) -> Any:
        held.set()
        await asyncio.Event().wait()

    facade = ServiceFacade({"session.list": stalled})
    running = asyncio.ensure_future(sessions(facade))
    await held.wait()
    assert facade.cut() == 1
    with pytest.raises(ACPError) as cut:
        await running
    assert cut.value.details["effect"] == "none"
    assert cut.value.details["retryable"] is True
