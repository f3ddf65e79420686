"""Leases with real processes: a runner frozen past its lease is taken over and, resumed,
writes nothing; an ``agents serve`` SIGKILLed mid-plan or mid-apply has its plan settled by
another server on the same database, which keeps serving; ``session.tell`` on one session
through two servers at once keeps one history, indexes 0..n-1. The server pairs run over
one SQLite file and over one PostgreSQL schema (skipped loudly without PostgreSQL, required
under CI=true)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import psycopg
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.facade.domain.plans import leases, model
from cleveragents.acp.facade.domain.plans.engine import PlanEngine
from cleveragents.acp.facade.factory import IDLE_ENV, open_facade
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.facade.store.base import EventFilter, StoredEvent
from cleveragents.acp.v1 import plan_pb2, session_pb2
from tests import postgres
from tests.facade.plans.helpers import (
    INPUTS,
    PY,
    add_action,
    add_command_tool,
    add_profile,
    add_project,
    eventually,
    gone,
    plan_events,
    run,
    snapshot,
    status,
    use,
    wait_for,
    write_tree,
)
from tests.facade.plans.plan_child import FREEZE_ENV, GATED
from tests.server_process import ServerProcess, Tokens, kill_group, start_server

REPO = pathlib.Path(__file__).resolve().parents[3]
TIMEOUT = 30.0
TELLS_EACH = 10


def _wait_for_text(path: pathlib.Path, text: str, child: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while text not in (path.read_text(errors="replace") if path.exists() else ""):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {path}"
        time.sleep(0.05)


def _pid(path: pathlib.Path) -> int:
    deadline = time.monotonic() + TIMEOUT
    while not (path.exists() and path.read_text()):
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.02)
    return int(path.read_text())


@contextlib.contextmanager
def _child(*args: str, stderr: pathlib.Path, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    with open(stderr, "w") as err:
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.facade.plans.plan_child", *args],
            stdout=subprocess.PIPE,
            stderr=err,
            cwd=REPO,
            env={**os.environ, **env},
            start_new_session=True,
        )
    try:
        yield child
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGCONT)
        kill_group(child)
        assert child.stdout is not None
        child.stdout.close()


def _line(child: subprocess.Popen[bytes]) -> str:
    assert child.stdout is not None
    line = child.stdout.readline().decode().strip()
    assert line, "the child printed nothing"
    return line


async def test_a_frozen_runner_is_taken_over_and_writes_nothing_when_it_wakes(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, database: str
) -> None:
    folder = tmp_path / "repo"
    write_tree(folder)
    db = database
    pid_file, gate, stderr = tmp_path / "pid", tmp_path / "gate", tmp_path / "child.stderr"
    env = {leases.TTL_ENV: "1"}
    with _child("gated", str(db), str(folder), str(pid_file), str(gate), stderr=stderr, env=env) as child:
        plan_id = _line(child)
        command = _pid(pid_file)
        try:
            # Frozen, the runner renews nothing; its process still exists, so only the
            # lease's expiry (on the database's clock) lets another process take over.
            _freeze_holding_no_sqlite_lock(child, db)
            monkeypatch.setenv(leases.TTL_ENV, "1")
            facade = open_facade(db, takeover=True)
            client = ACPClient(LocalTransport(facade, owns_facade=True))
            try:
                failed = await wait_for(client, plan_id, model.FAILED, seconds=TIMEOUT)
                assert (failed.phase, failed.last_error.code) == (model.EXECUTE, model.INTERRUPTED)
                settled = await _stored_events(facade, plan_id)
                # Awake, its command done, the runner tries to record the step: refused.
                gate.touch()
                child.send_signal(signal.SIGCONT)
                await asyncio.to_thread(_wait_for_text, stderr, "stopped without writing", child)
                assert await status(client, plan_id) == failed
                assert await _stored_events(facade, plan_id) == settled
                assert "tool.completed" not in [e.type for e in settled]
            finally:
                await client.close()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(command, signal.SIGKILL)


def _freeze_holding_no_sqlite_lock(child: subprocess.Popen[bytes], db: str) -> None:
    """SIGSTOP ``child``; on SQLite, at an instant it holds no write lock on the file or its
    WAL index (stopped holding one, it is woken and stopped again). A process frozen inside
    a SQLite write transaction stops every writer of the file until it runs again: SQLite has
    no server to end that transaction, so no takeover is possible, and none is claimed here
    (docs/server.md, "A locked database"). PostgreSQL ends such a transaction itself (the
    replica test below freezes one inside its renewal)."""
    paths = [] if "://" in db else [db, f"{db}-shm"]
    for _ in range(100):
        child.send_signal(signal.SIGSTOP)
        _stopped(child)
        if not _write_locks(child.pid, paths):
            return
        child.send_signal(signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"the runner held a SQLite write lock at each of 100 stops: {paths}")


def _write_locks(pid: int, paths: list[str]) -> list[str]:
    """The POSIX write locks ``pid`` holds on any of ``paths`` (lines of /proc/locks)."""
    inodes = {f":{os.stat(path).st_ino}" for path in paths if os.path.exists(path)}
    with open("/proc/locks") as locks:
        return [
            line
            for line in locks
            if (fields := line.split())[1] == "POSIX"
            and fields[3] == "WRITE"
            and fields[4] == str(pid)
            and any(fields[5].endswith(inode) for inode in inodes)
        ]


async def _stored_events(facade: ServiceFacade, plan_id: str) -> list[StoredEvent]:
    """The plan's events as stored (no stream, so nothing depends on how soon it answers)."""
    store = next(r for r in facade._resources if isinstance(r, PlanEngine)).store
    return await store.read(lambda s: s.read_events(0, 10_000, EventFilter(plan_id=plan_id)))


def _stopped(child: subprocess.Popen[bytes]) -> None:
    """Blocks until the child has stopped itself (SIGSTOP)."""
    _, how = os.waitpid(child.pid, os.WUNTRACED)
    assert os.WIFSTOPPED(how), how


def _idle_holding_a_lease_row(application: str) -> bool:
    """Whether the connection named ``application`` sits idle in a transaction that has
    updated a row of ``leases`` (its lock held until that transaction ends)."""
    with postgres.admin() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid "
            "JOIN pg_class c ON c.oid = l.relation WHERE a.application_name = %s "
            "AND a.state = 'idle in transaction' AND c.relname = 'leases' "
            "AND l.mode = 'RowExclusiveLock' AND l.granted",
            (application,),
        ).fetchone()
    return bool(row and row[0])


def _lease_expired(url: str) -> None:
    """Blocks until the one lease of the schema ``url`` names has expired (as committed, on
    the database's clock), so the taker's start-up recovery, not its scanner, claims it."""
    with psycopg.connect(url, autocommit=True) as conn:
        deadline = time.monotonic() + TIMEOUT
        while True:
            row = conn.execute(
                "SELECT expires > extract(epoch FROM clock_timestamp()) FROM leases"
            ).fetchone()
            if row is not None and not row[0]:
                return
            assert time.monotonic() < deadline, "the lease never expired"
            time.sleep(0.02)


async def test_a_replica_frozen_inside_its_lease_renewal_is_taken_over_and_writes_nothing(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL: a replica stopped inside its renewal's transaction keeps the lease row
    locked; the server ends that transaction after $ACP_STORE_IDLE_TRANSACTION_SECONDS and
    the taker's recovery, which gives up on a lock after 0.5 s, waits it out instead of
    failing with STORE_BUSY. Woken, the frozen replica writes nothing."""
    folder = tmp_path / "repo"
    write_tree(folder)
    pid_file, gate, stderr = tmp_path / "pid", tmp_path / "gate", tmp_path / "child.stderr"
    application = f"acp_frozen_{secrets.token_hex(4)}"
    with postgres.fresh_schema("frozen") as url:
        env = {leases.TTL_ENV: "1", FREEZE_ENV: "1", IDLE_ENV: "8"}
        db = f"{url}&application_name={application}"
        with _child("gated", db, str(folder), str(pid_file), str(gate), stderr=stderr, env=env) as child:
            command = _pid(pid_file)
            try:
                await asyncio.to_thread(_stopped, child)
                assert _idle_holding_a_lease_row(application)
                await asyncio.to_thread(_lease_expired, url)
                monkeypatch.setenv(leases.TTL_ENV, "1")
                monkeypatch.setenv("ACP_STORE_WRITE_TIMEOUT_SECONDS", "0.5")
                facade = open_facade(url, takeover=True)
                client = ACPClient(LocalTransport(facade, owns_facade=True))
                try:
                    assert any("plan recovery waits for a lock" in r.getMessage() for r in caplog.records)
                    listed = await client.call("plan.list")
                    assert isinstance(listed, plan_pb2.ListPlansResponse)
                    (plan_id,) = [p.meta.id for p in listed.plans]
                    failed = await wait_for(client, plan_id, model.FAILED, seconds=TIMEOUT)
                    assert (failed.phase, failed.last_error.code) == (model.EXECUTE, model.INTERRUPTED)
                    settled = await _stored_events(facade, plan_id)
                    assert settled[-1].type == "plan.state_changed"
                    gate.touch()
                    child.send_signal(signal.SIGCONT)
                    await asyncio.to_thread(_wait_for_text, stderr, "stopped without writing", child)
                    assert await status(client, plan_id) == failed
                    assert await _stored_events(facade, plan_id) == settled
                finally:
                    await client.close()
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(command, signal.SIGKILL)


# two `agents serve` on one database --------------------------------------------------------


@pytest.fixture
def open_dir() -> Iterator[pathlib.Path]:
    """A folder a command run as another user (``--command-user nobody`` under root) can write."""
    folder = pathlib.Path(tempfile.mkdtemp(prefix="acp-leases-"))
    folder.chmod(0o777)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _command_user() -> list[str]:
    return ["--command-user", "nobody"] if os.geteuid() == 0 else []


# The step's interpreter: under root the command runs as nobody, who may not reach this
# virtualenv's (it may live under /root); the gated step needs only the standard library.
COMMAND_PY = "/usr/bin/python3" if os.geteuid() == 0 and os.path.exists("/usr/bin/python3") else PY


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[str]:
    """One database two servers share: a SQLite file, or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield str(tmp_path / "shared.db")
        return
    with postgres.fresh_schema("leases") as url:
        yield url


@pytest.fixture
def servers(tmp_path: pathlib.Path, database: str) -> Iterator[tuple[ServerProcess, ServerProcess, Tokens]]:
    tokens = Tokens.create(tmp_path)
    db = database
    pause = tmp_path / "pause"
    env = {leases.TTL_ENV: "3", "ACP_TEST_APPLY_PAUSE_FILE": str(pause)}
    started: list[ServerProcess] = []
    try:
        for name in ("a", "b"):
            started.append(
                start_server(
                    tmp_path,
                    "--db",
                    db,
                    "--allow-commands",
                    *_command_user(),
                    tokens=tokens.path,
                    env=env,
                    name=name,
                )
            )
        yield started[0], started[1], tokens
    finally:
        for server in started:
            kill_group(server.process)
            if server.process.stdout is not None:
                server.process.stdout.close()


@pytest.fixture
async def clients(
    servers: tuple[ServerProcess, ServerProcess, Tokens],
) -> AsyncIterator[tuple[ACPClient, ACPClient]]:
    a, b, tokens = servers
    made = [
        ACPClient(
            HTTPTransport(httpx.AsyncClient(base_url=s.http, timeout=TIMEOUT), owns_client=True),
            token=tokens.tokens["alice"],
        )
        for s in (a, b)
    ]
    try:
        yield made[0], made[1]
    finally:
        for client in made:
            await client.close()


async def _keeps_serving(client: ACPClient) -> None:
    created = await client.call("session.create", namespace="default", title="after")
    assert isinstance(created, session_pb2.CreateSessionResponse)
    told = await client.call("session.tell", session_id=created.session.meta.id, content="still here")
    assert isinstance(told, session_pb2.TellSessionResponse)


async def test_sigkill_mid_plan_another_server_takes_it_over(
    tmp_path: pathlib.Path,
    open_dir: pathlib.Path,
    servers: tuple[ServerProcess, ServerProcess, Tokens],
    clients: tuple[ACPClient, ACPClient],
) -> None:
    a, _, _ = servers
    through_a, through_b = clients
    folder = tmp_path / "repo"
    write_tree(folder)
    await add_project(through_a, folder)
    pid_file = open_dir / "pid"
    await add_command_tool(through_a, "gated", [COMMAND_PY, "-c", GATED, "{{pid_file}}", "{{gate}}"])
    await add_profile(through_a, "gated", allowed_tools=["gated"])
    args = {"pid_file": str(pid_file), "gate": str(open_dir / "gate")}
    await add_action(through_a, steps=[{"id": "wait", "tool": "gated", "args": args}], profile="gated")
    plan_id = (await use(through_a, {})).meta.id
    await through_a.call("plan.execute", plan_id=plan_id)
    command = _pid(pid_file)
    acknowledged = await plan_events(through_b, plan_id)
    try:
        kill_group(a.process)

        async def command_gone() -> bool:
            return gone(command)

        # The command (its own session, run as another user) dies with its server.
        await eventually(command_gone, seconds=TIMEOUT)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(command, signal.SIGKILL)
    failed = await wait_for(through_b, plan_id, model.FAILED, seconds=TIMEOUT)
    assert (failed.phase, failed.last_error.code) == (model.EXECUTE, model.INTERRUPTED)
    events = await plan_events(through_b, plan_id)
    # Nothing acknowledged before the kill is lost; the takeover only adds to it.
    assert events[: len(acknowledged)] == acknowledged
    assert events[-1].plan_state_changed.reason == model.INTERRUPTED
    tree = await through_b.call("plan.tree", plan_id=plan_id)
    assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
    assert tree.steps[0].error.code == model.INTERRUPTED
    await _keeps_serving(through_b)


async def test_sigkill_mid_apply_another_server_restores_the_project(
    tmp_path: pathlib.Path,
    servers: tuple[ServerProcess, ServerProcess, Tokens],
    clients: tuple[ACPClient, ACPClient],
) -> None:
    a, _, _ = servers
    through_a, through_b = clients
    folder = tmp_path / "repo"
    write_tree(folder)
    before = snapshot(folder)
    await add_project(through_a, folder)
    await add_action(through_a)
    plan = await run(through_a, (await use(through_a, INPUTS)).meta.id)
    assert plan.state == model.SUCCEEDED
    pause = tmp_path / "pause"
    pause.write_text("2")
    applying = asyncio.ensure_future(through_a.call("plan.apply", plan_id=plan.meta.id))
    try:

        async def paused() -> bool:
            return (tmp_path / "pause.2").exists()

        await eventually(paused, seconds=TIMEOUT)
        assert snapshot(folder) != before, "the kill must land after apply wrote files"
        kill_group(a.process)
    finally:
        applying.cancel()
        with contextlib.suppress(BaseException):
            await applying
    failed = await wait_for(through_b, plan.meta.id, model.FAILED, seconds=TIMEOUT)
    assert (failed.phase, failed.last_error.code) == (model.APPLY, model.INTERRUPTED)
    assert snapshot(folder) == before, "none of the plan's changes stay"
    # Apply may run again, through the survivor, and completes.
    pause.unlink()
    applied = await through_b.call("plan.apply", plan_id=plan.meta.id)
    assert isinstance(applied, plan_pb2.ApplyPlanResponse)
    assert applied.plan.state == model.SUCCEEDED
    await _keeps_serving(through_b)


async def test_tells_through_two_servers_at_once_keep_one_history(
    clients: tuple[ACPClient, ACPClient],
) -> None:
    """On SQLite the one writer serializes them; on PostgreSQL the append locks the session's
    row until it commits."""
    through_a, through_b = clients
    created = await through_a.call("session.create", namespace="default", title="shared")
    assert isinstance(created, session_pb2.CreateSessionResponse)
    session_id = created.session.meta.id

    async def tell(client: ACPClient, text: str) -> None:
        told = await client.call("session.tell", session_id=session_id, content=text)
        assert isinstance(told, session_pb2.TellSessionResponse)

    texts = [f"{name}-{i}" for i in range(TELLS_EACH) for name in ("a", "b")]
    await asyncio.gather(*(tell(through_a if t.startswith("a") else through_b, t) for t in texts))
    for client in clients:
        shown = await client.call("session.show", session_id=session_id)
        assert isinstance(shown, session_pb2.GetSessionResponse)
        history = list(shown.messages)
        assert [m.index for m in history] == list(range(len(history)))
        said = [m.content for m in history if m.role == session_pb2.MESSAGE_ROLE_USER]
        # Every tell once: none lost, none doubled.
        assert sorted(said) == sorted(texts)
