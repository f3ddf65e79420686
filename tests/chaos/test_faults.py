"""The fault-injection suite (issue 30): real ``agents serve`` processes on loopback, a load of
real clients, one fault per case, and the acknowledged-writes ledger checked afterwards
(tests/chaos/ledger.py). ``make test`` runs each case small; ``make chaos`` runs the same code
with ``ACP_CHAOS_SCALE`` (more writers, more writes, the full 10 s PostgreSQL outage).

Cases that found a bug on main (9a4ea92) and fail there:
- SIGTERM with long calls in flight: the cut calls' effects were stored but their clients got a
  plain 500 (item 6);
- disk full: INTERNAL_ERROR and ``/readyz`` 200 (item 7);
- PostgreSQL restarted / stopped: calls cut got a non-retryable INTERNAL_ERROR, and while down
  STORE_BUSY "locked by another process"; the client gave up after 4-8 s (item 7).
Two more failed on main and run under ``make chaos`` (``make test`` has their deterministic
tests: tests/facade/store/test_after_a_failure.py, tests/gateway/test_sqlite_neighbours.py):
- failed statements beside the load on pooled PostgreSQL connections (item 1);
- another process opening the SQLite file in a loop (item 2: SIGBUS).
So do the two SIGSTOP cases: two replicas on one database, the load on the one not frozen,
the frozen one holding a plan's lease, woken after the other took the plan over
(deterministic tests: tests/facade/plans/test_apply_fencing.py, test_lease_processes.py):
- mid-apply, after file 5 of 12 (the apply hook ``apply.PAUSE_ENV``), SQLite and PostgreSQL:
  on main it wrote the other 7 files into the restored folder, its caller got INTERNAL_ERROR
  (item 3; it fails with apply's fence removed);
- mid-transaction, PostgreSQL: frozen inside its lease renewal's transaction, which keeps the
  lease row locked: on main nothing ended it, renewals and takeover got STORE_BUSY (item 4;
  without ``idle_in_transaction_session_timeout`` the other replica never takes over).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import signal
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.contract.retry import RetryPolicy
from cleveragents.acp.facade.domain.plans import apply, leases, model
from cleveragents.acp.facade.factory import IDLE_ENV
from tests.chaos.ledger import SCALE, Ledger, Load, client_for, verify
from tests.chaos.processes import Served, fill, own_postgres, small_tmpfs
from tests.facade.plans.helpers import (
    add_action,
    add_project,
    eventually,
    run,
    snapshot,
    status,
    use,
    wait_for,
    write_tree,
)
from tests.server_process import ServerProcess, Tokens

WRITERS = 2 * SCALE
PER_WRITER = 8 * SCALE
# Cases ``make test`` leaves to ``make chaos`` (it keeps one of each kind of fault small: the
# whole group killed is also tests/gateway/test_workers.py's, a restart is also the stop's cut).
CHAOS_ONLY = pytest.mark.skipif(SCALE == 1, reason="make chaos only (ACP_CHAOS_SCALE > 1)")
# How long the "stopped" case keeps PostgreSQL down: the 10 s under ``make chaos``,
# shorter in ``make test`` (each is within the clients' 20 s retry window).
OUTAGE_SECONDS = 10.0 if SCALE > 1 else 3.0


def served(tmp_path: pathlib.Path, db: str | None = None, *extra: str) -> Served:
    return Served(tmp_path, Tokens.create(tmp_path), db or str(tmp_path / "acp.db"), extra)


def load(server: Served, ledger: Ledger, *, grpc: bool = False) -> Load:
    return Load(
        ledger,
        server.token,
        http_url=None if grpc else server.http_url,
        grpc_target=server.grpc_target if grpc else None,
        writers=WRITERS,
        per_writer=PER_WRITER,
    )


def progressed(count: int) -> Callable[[Ledger], bool]:
    return lambda ledger: ledger.count("acked") >= count


async def finish_and_verify(server: Served, work: Load, ledger: Ledger, *, all_acked: bool) -> None:
    await work.finish()
    if all_acked:
        # The fault lasted less than the clients' retry window: every call got through.
        assert ledger.count("acked", "applied") == WRITERS * PER_WRITER, (
            ledger.summary(),
            [(e.message, e.details) for e in ledger.errors("failed", "none", "unknown")[:3]],
            server.faults(),
        )
    async with client_for(server.http_url, None, server.token) as client:
        await verify(ledger, client, work.sessions)


# kill -9 ---------------------------------------------------------------------------------


async def under_load(
    server: Served, fault: Callable[[], Awaitable[None]], *, grpc: bool = False, all_acked: bool = True
) -> Ledger:
    """Start ``server``, put the load on it, inject ``fault`` once it has made progress, let
    the load finish and check the ledger; the server is killed at the end."""
    await asyncio.to_thread(server.start)
    ledger = Ledger()
    work = load(server, ledger, grpc=grpc)
    try:
        await work.start()
        await ledger.reached(progressed(WRITERS * 2))
        await fault()
        await finish_and_verify(server, work, ledger, all_acked=all_acked)
    finally:
        server.kill()
    return ledger


@pytest.mark.parametrize("grpc", [False, pytest.param(True, marks=CHAOS_ONLY)], ids=["http", "grpc"])
async def test_kill_9_of_a_server_loses_nothing(tmp_path: pathlib.Path, grpc: bool) -> None:
    server = served(tmp_path)

    async def kill_and_restart() -> None:
        server.kill()
        await asyncio.to_thread(server.start)

    await under_load(server, kill_and_restart, grpc=grpc)


@CHAOS_ONLY
async def test_kill_9_of_one_worker_loses_nothing(tmp_path: pathlib.Path) -> None:
    server = served(tmp_path, None, "--workers", "2")

    async def kill_a_worker() -> None:
        assert server.process is not None
        line = next(line for line in server.process.stdout if line.startswith("acp-ready "))
        os.kill(int(line.split('"workers": [')[1].split(",")[0]), signal.SIGKILL)

    await under_load(server, kill_a_worker)


@CHAOS_ONLY
async def test_kill_9_of_the_whole_group_loses_nothing(tmp_path: pathlib.Path) -> None:
    server = served(tmp_path, None, "--workers", "2")

    async def kill_and_restart() -> None:
        server.kill()
        await asyncio.to_thread(server.start)

    await under_load(server, kill_and_restart)


# SIGTERM with long calls in flight ----------------------------------------------------------


@pytest.mark.parametrize("workers", ["1", pytest.param("2", marks=CHAOS_ONLY)])
async def test_sigterm_with_long_calls_in_flight_says_what_each_cut_call_did(
    tmp_path: pathlib.Path, workers: str
) -> None:
    """Another process holds the SQLite write lock, so every write in flight waits; SIGTERM
    (grace 1 s); once the server has cut them, the lock goes and their writes commit: each cut
    call is told ``applied`` (an envelope; on main a plain 500 its client took as failed). The
    server is started again; the clients' retries of the rest get through."""
    db = tmp_path / "acp.db"
    server = served(tmp_path, str(db), "--workers", workers, "--grace-seconds", "1")
    env = {"ACP_STORE_WRITE_TIMEOUT_SECONDS": "120"}
    # The lock holder maps the WAL index before the server does and keeps it: a process
    # opening the file after the server may truncate it under the server's mapping (SIGBUS,
    # issue 30 item 2, the layers fix: test_another_process_opening_the_file_...).
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("PRAGMA journal_mode=WAL")
    holder.execute("SELECT count(*) FROM sqlite_master").fetchone()
    await asyncio.to_thread(server.start, env)
    ledger = Ledger()
    work = load(server, ledger)
    try:
        await work.start()
        await ledger.reached(progressed(WRITERS))
        holder.execute("BEGIN IMMEDIATE")
        # Every writer's next call sent; a read answered after them (the server reads its
        # connections in arrival order): those calls are in the server, waiting for the lock.
        await work.all_writing()
        async with client_for(server.http_url, None, server.token) as reader:
            await reader.call("session.show", session_id=work.sessions[0])
        assert server.process is not None
        server.process.process.send_signal(signal.SIGTERM)
        await _until_logged(server.process, "were cut")
        holder.execute("ROLLBACK")
        assert await asyncio.to_thread(server.process.process.wait, 60) == 0
        await ledger.reached(lambda led: led.count("applied", "failed") >= 1)
        await asyncio.to_thread(server.start, env)
        await finish_and_verify(server, work, ledger, all_acked=False)
        assert ledger.count("failed") == 0, ledger.errors("failed")
        assert ledger.count("applied") >= 1, ledger.summary()
    finally:
        holder.close()
        server.kill()


async def _until_logged(process: ServerProcess, text: str) -> None:
    """Until the server logged ``text`` (its log goes to stdout, uvicorn's to stderr)."""
    for _ in range(600):
        if any(text in line for line in list(process.stdout)):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{text!r} never logged: {process.stdout[-20:]} {process.stderr()}")


# disk full ---------------------------------------------------------------------------------


async def test_a_full_disk_refuses_writes_as_such_and_is_not_ready(tmp_path: pathlib.Path) -> None:
    with small_tmpfs("24m") as disk:
        server = served(tmp_path, str(disk / "acp.db"))
        await asyncio.to_thread(server.start)
        ledger = Ledger()
        work = load(server, ledger)
        try:
            await work.start()
            await ledger.reached(progressed(WRITERS))
            filler = disk / "filler"
            await asyncio.to_thread(fill, filler)
            no_retry = ACPClient(
                HTTPTransport.connect(server.http_url, retry=RetryPolicy.OFF), token=server.token
            )
            async with no_retry:
                refused = await _refused(no_retry, work.sessions[0])
            assert (refused.code, refused.details.get("refinement")) == (
                "BUDGET_EXCEEDED",
                "STORE_DISK_FULL",
            )
            assert refused.details["retryable"] is False
            async with httpx.AsyncClient(base_url=server.http_url) as http:
                ready = await http.get("/readyz")
                assert ready.status_code == 503, ready.text
                assert ready.json()["error"]["details"]["status"] == "store_disk_full"
                filler.unlink()
                ready = await http.get("/readyz")
                assert ready.status_code == 200, ready.text
            await finish_and_verify(server, work, ledger, all_acked=False)
            assert ledger.count("failed") == 0, ledger.errors("failed")
        finally:
            server.kill()


async def _refused(client: ACPClient, session_id: str) -> ACPError:
    """The error of the first write refused (a write or two may still fit on the disk)."""
    for index in range(200):
        try:
            await client.call("session.tell", session_id=session_id, content=f"full {index}")
        except ACPError as err:
            return err
    raise AssertionError("200 writes fit on a full disk")


# PostgreSQL restarted, stopped --------------------------------------------------------------


@pytest.mark.parametrize("fault", [pytest.param("restart", marks=CHAOS_ONLY), "stop"])
async def test_postgresql_restarted_or_stopped_under_load_loses_nothing(
    tmp_path: pathlib.Path, fault: str
) -> None:
    with own_postgres() as cluster:
        server = served(tmp_path, cluster.url)
        # A call waits this long for a connection while the database is down.
        await asyncio.to_thread(server.start, {"ACP_STORE_WRITE_TIMEOUT_SECONDS": "2"})
        ledger = Ledger()
        work = load(server, ledger)
        try:
            await work.start()
            await ledger.reached(progressed(WRITERS * 2))
            if fault == "restart":
                await asyncio.to_thread(cluster.restart)
            else:
                await asyncio.to_thread(cluster.stop)
                down = ACPClient(
                    HTTPTransport.connect(server.http_url, retry=RetryPolicy.OFF), token=server.token
                )
                async with down:
                    with pytest.raises(ACPError) as refused:
                        await down.call("session.tell", session_id=work.sessions[0], content="while down")
                assert refused.value.details.get("refinement") == "STORE_UNAVAILABLE", refused.value
                assert refused.value.details["retryable"] is True
                assert "locked" not in refused.value.message
                async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
                    ready = await http.get("/readyz")
                assert ready.status_code == 503, ready.text
                assert ready.json()["error"]["details"]["status"] == "store_unreachable"
                # The outage itself: how long the database stays down, not a wait for a result.
                await asyncio.sleep(OUTAGE_SECONDS)
                await asyncio.to_thread(cluster.start)
            await finish_and_verify(server, work, ledger, all_acked=True)
            async with httpx.AsyncClient(base_url=server.http_url, timeout=60) as http:
                ready = await http.get("/readyz")
            assert ready.status_code == 200, ready.text
        finally:
            server.kill()


# faults with deterministic tests of their own in make test ----------------------------------


@CHAOS_ONLY
async def test_failed_statements_beside_the_load_break_no_pooled_connection(tmp_path: pathlib.Path) -> None:
    """Writes that fail (a tell to a missing session rolls back) interleaved with the load on
    the same pooled PostgreSQL connections: every later call still succeeds (item 1: on main
    ``prepared statement "acp_N" does not exist``, INTERNAL_ERROR, from then on)."""
    with own_postgres() as cluster:
        server = served(tmp_path, cluster.url)
        await asyncio.to_thread(server.start)
        ledger = Ledger()
        work = load(server, ledger)
        try:
            await work.start()
            async with client_for(server.http_url, None, server.token) as failing:
                for index in range(WRITERS * PER_WRITER):
                    operation = "session.delete" if index % 2 else "session.tell"
                    params = {"session_id": f"missing-{index}"}
                    if operation == "session.tell":
                        params["content"] = "x"
                    with pytest.raises(ACPError) as missing:
                        await failing.call(operation, params)
                    assert missing.value.code == "NOT_FOUND", missing.value
            await finish_and_verify(server, work, ledger, all_acked=True)
        finally:
            server.kill()


@CHAOS_ONLY
async def test_another_process_opening_the_file_in_a_loop_breaks_nothing(tmp_path: pathlib.Path) -> None:
    """An ``sqlite3`` reader opening the server's file again and again beside the load
    (item 2: on main the server dies of SIGBUS within seconds)."""
    db = tmp_path / "acp.db"
    server = served(tmp_path, str(db))
    await asyncio.to_thread(server.start)
    ledger = Ledger()
    work = load(server, ledger)
    stop = asyncio.Event()

    def neighbour() -> None:
        while not stop.is_set():
            conn = sqlite3.connect(db)
            try:
                conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
            finally:
                conn.close()

    try:
        await work.start()
        opener = asyncio.ensure_future(asyncio.to_thread(neighbour))
        try:
            await finish_and_verify(server, work, ledger, all_acked=True)
        finally:
            stop.set()
            await opener
        assert server.process is not None
        assert server.process.process.poll() is None, server.process.stderr()
    finally:
        server.kill()


# SIGSTOP of a lease holder ------------------------------------------------------------------

PLAN_FILES = 12
FROZEN_AFTER = 5


def replica(tmp_path: pathlib.Path, tokens: Tokens, name: str, db: str) -> Served:
    """One of two ``agents serve`` on one database (its own folder for its logs)."""
    directory = tmp_path / name
    directory.mkdir()
    return Served(directory, tokens, db)


@contextlib.asynccontextmanager
async def frozen_apply(
    tmp_path: pathlib.Path,
    db: str,
    *,
    holder_db: str | None = None,
    env: dict[str, str] | None = None,
    holder_env: dict[str, str] | None = None,
) -> AsyncIterator[FrozenApply]:
    """Replicas ``a`` (on ``holder_db``, default ``db``, with ``holder_env`` too) and ``b``,
    both with ``env``, the load on ``b``; a plan
    of PLAN_FILES writes run through ``a`` and its apply through ``a`` paused (the apply
    hook, ``apply.PAUSE_ENV``) after FROZEN_AFTER files, holding the plan's lease."""
    tokens = Tokens.create(tmp_path)
    pause = tmp_path / "pause"
    env = {leases.TTL_ENV: "2", apply.PAUSE_ENV: str(pause), **(env or {})}
    a, b = replica(tmp_path, tokens, "a", holder_db or db), replica(tmp_path, tokens, "b", db)
    await asyncio.to_thread(a.start, {**env, **(holder_env or {})})
    await asyncio.to_thread(b.start, env)
    folder = tmp_path / "repo"
    write_tree(folder, {"keep.txt": b"kept\n"})
    no_retry = ACPClient(HTTPTransport.connect(a.http_url, retry=RetryPolicy.OFF, timeout=120), token=a.token)
    applying: asyncio.Future[Any] | None = None
    try:
        async with client_for(a.http_url, None, a.token) as through_a:
            await add_project(through_a, folder)
            steps = [
                {"tool": "fs.write", "args": {"path": f"f{i:02}.txt", "content": "plan"}}
                for i in range(PLAN_FILES)
            ]
            await add_action(through_a, steps=steps)
            plan = await run(through_a, (await use(through_a, {})).meta.id)
            assert plan.state == model.SUCCEEDED, plan
        ledger = Ledger()
        work = load(b, ledger)
        await work.start()
        await ledger.reached(progressed(WRITERS))
        original = snapshot(folder)
        pause.write_text(str(FROZEN_AFTER))
        applying = asyncio.ensure_future(no_retry.call("plan.apply", plan_id=plan.meta.id))

        async def paused() -> bool:
            return (tmp_path / f"pause.{FROZEN_AFTER}").exists()

        await eventually(paused, seconds=60)
        written = sorted(p.name for p in folder.iterdir())
        assert written == [*(f"f{i:02}.txt" for i in range(FROZEN_AFTER)), "keep.txt"], written
        yield FrozenApply(a, b, plan.meta.id, folder, original, pause, applying, ledger, work)
    finally:
        if applying is not None and not applying.done():
            applying.cancel()
            with contextlib.suppress(BaseException):
                await applying
        await no_retry.close()
        for server in (a, b):
            if server.process is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.process.process.pid, signal.SIGCONT)
                server.kill()


@dataclass
class FrozenApply:
    a: Served
    b: Served
    plan_id: str
    folder: pathlib.Path
    original: dict[str, Any]
    pause: pathlib.Path
    applying: asyncio.Future[Any]
    ledger: Ledger
    work: Load

    def signal_a(self, signum: signal.Signals) -> None:
        assert self.a.process is not None
        os.killpg(self.a.process.process.pid, signum)

    async def taken_over_then_woken(self) -> None:
        """With ``a`` frozen: ``b`` takes the plan over and restores the folder; then ``a``
        wakes, its apply let go on. Checks that ``a`` wrote nothing after the takeover (folder,
        plan, events), that its caller was told LEASE_LOST (retryable), and the ledger."""
        async with client_for(self.b.http_url, None, self.b.token) as through_b:
            try:
                failed = await wait_for(through_b, self.plan_id, model.FAILED, seconds=60)
            except TimeoutError:
                raise AssertionError(f"replica b never took the plan over: {self.b.faults()}") from None
            assert (failed.phase, failed.last_error.code) == (model.APPLY, model.INTERRUPTED)
            assert snapshot(self.folder) == self.original, "the taker's restore is incomplete"
            self.pause.write_text("go")
            self.signal_a(signal.SIGCONT)
            with pytest.raises(ACPError) as info:
                await self.applying
            assert snapshot(self.folder) == self.original, "the frozen holder wrote after the takeover"
            assert not any(name.startswith(".acp-apply-") for name in os.listdir(self.folder))
            refused = info.value
            assert (refused.code, refused.details.get("refinement")) == ("INVALID_STATE", "LEASE_LOST"), (
                refused,
                refused.details,
            )
            assert refused.details["retryable"] is True
            assert refused.details.get("holder"), refused.details
            assert await status(through_b, self.plan_id) == failed
        await self.work.finish()
        # Verified through the woken holder: it serves again, and reads what the taker kept.
        async with client_for(self.a.http_url, None, self.a.token) as through_a:
            assert await status(through_a, self.plan_id) == failed
            events = await verify(self.ledger, through_a, self.work.sessions)
        (last,) = [e for e in events if e.plan_id == self.plan_id][-1:]
        # The taker's record is the plan's last event: nothing from the old holder after it.
        assert last.HasField("plan_state_changed"), last
        assert last.plan_state_changed.reason == model.INTERRUPTED, last


@CHAOS_ONLY
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_sigstop_of_a_lease_holder_mid_apply_writes_nothing_after_the_takeover(
    tmp_path: pathlib.Path, backend: str
) -> None:
    """Apply frozen (SIGSTOP) after file 5 of 12; the other replica takes over and restores
    the folder; woken, the holder writes none of the other 7 files and its caller gets
    LEASE_LOST (item 3: on main it wrote them all into the restored folder, INTERNAL_ERROR)."""
    with contextlib.ExitStack() as stack:
        db = str(tmp_path / "acp.db") if backend == "sqlite" else stack.enter_context(own_postgres()).url
        async with frozen_apply(tmp_path, db) as frozen:
            frozen.signal_a(signal.SIGSTOP)
            await frozen.taken_over_then_woken()


@CHAOS_ONLY
async def test_sigstop_of_a_lease_holder_mid_transaction_stalls_nothing(tmp_path: pathlib.Path) -> None:
    """PostgreSQL: the holder (its apply paused, holding the plan's lease) is frozen inside
    its lease renewal's transaction, the UPDATE done and no COMMIT sent, so its backend sits
    idle in transaction holding the lease row. The server ends that transaction after
    ``IDLE_ENV`` seconds and the taker's recovery, retrying, takes over (item 4: on main the
    row stayed locked and renewals and takeover failed with STORE_BUSY). Woken, the holder
    writes nothing. The exact point: the test locks the lease row, waits until the renewal
    waits for it, SIGSTOPs the holder, then lets the UPDATE through."""
    with own_postgres() as cluster:
        application = "acp_chaos_frozen"
        holder_db = f"{cluster.url}?application_name={application}"
        # The frozen transaction lasts IDLE_ENV seconds; the renewal waits for the test's
        # lock for up to the holder's write timeout (``lock_timeout``): both long enough to be
        # seen.
        frozen_for = {IDLE_ENV: "8"}
        waits = {"ACP_STORE_WRITE_TIMEOUT_SECONDS": "60"}
        async with frozen_apply(
            tmp_path, cluster.url, holder_db=holder_db, env=frozen_for, holder_env=waits
        ) as frozen:
            with psycopg.connect(cluster.url) as admin:
                name = leases.lease_name(frozen.plan_id)
                locked = admin.execute("SELECT 1 FROM leases WHERE name = %s FOR UPDATE", (name,)).fetchone()
                assert locked is not None, "the apply holds no lease row"
                await asyncio.to_thread(_renewal_waits, cluster.url, application)
                frozen.signal_a(signal.SIGSTOP)
                admin.rollback()
            await asyncio.to_thread(_idle_in_renewal, cluster.url, application)
            with psycopg.connect(cluster.url) as admin, pytest.raises(psycopg.errors.LockNotAvailable):
                admin.execute("SELECT 1 FROM leases WHERE name = %s FOR UPDATE NOWAIT", (name,))
            await frozen.taken_over_then_woken()
        # The takeover came after the server ended the frozen transaction, as it must.
        assert "idle-in-transaction timeout" in (cluster.root / "log").read_text()


def _until(url: str, application: str, condition: str, what: str) -> None:
    """Until a backend of ``application`` meets ``condition`` (polled on one connection;
    bounded, and a failure shows what the holder's backends were doing)."""
    query = "SELECT count(*) FROM pg_stat_activity a WHERE a.application_name = %s AND " + condition
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(3000):
            row = conn.execute(query, (application,)).fetchone()
            if row and row[0]:
                return
            time.sleep(0.02)
        seen = conn.execute(
            "SELECT state, wait_event_type, left(query, 60) FROM pg_stat_activity "
            "WHERE application_name = %s",
            (application,),
        ).fetchall()
    raise AssertionError(f"never: {what}; the holder's backends: {seen}")


RENEWAL = "starts_with(a.query, 'UPDATE leases SET expires')"


def _renewal_waits(url: str, application: str) -> None:
    """Until the holder's lease renewal waits for the row lock the test holds."""
    _until(
        url, application, f"a.wait_event_type = 'Lock' AND {RENEWAL}", "the renewal waited for the lease row"
    )


def _idle_in_renewal(url: str, application: str) -> None:
    """Until the frozen holder's backend sits idle in its renewal's transaction, the row
    updated (its lock held until the transaction ends)."""
    held = (
        f"a.state = 'idle in transaction' AND {RENEWAL} AND EXISTS ("
        "SELECT 1 FROM pg_locks l JOIN pg_class c ON c.oid = l.relation WHERE l.pid = a.pid "
        "AND c.relname = 'leases' AND l.mode = 'RowExclusiveLock' AND l.granted)"
    )
    _until(url, application, held, "the frozen holder sat idle in its renewal")
