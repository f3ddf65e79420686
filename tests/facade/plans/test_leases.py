"""Plan leases and fencing in one process (real SQLite files): a stale holder's writes of
every kind are refused by its token, inside the write's transaction; a second engine on the
same database leaves a live holder's plan alone, takes an expired one over and settles it,
and a cancel reaches a plan another engine runs. The same with real processes is in
test_lease_processes.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pathlib
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.plans import leases, model
from cleveragents.acp.facade.domain.plans.engine import PlanEngine
from cleveragents.acp.facade.domain.plans.leases import PlanLeases
from cleveragents.acp.facade.domain.plans.records import Change, CheckpointEntry, PlanRecords
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.facade.store.base import Lease, LeaseLostError, Record, Store, StoreUnavailableError
from cleveragents.acp.facade.store.postgres import PostgresStore
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import common_pb2, events_pb2, plan_pb2
from tests import postgres
from tests.facade.plans.helpers import (
    PY,
    add_action,
    add_command_tool,
    add_profile,
    add_project,
    eventually,
    gone,
    plan_events,
    status,
    use,
    wait_for,
    write_tree,
)
from tests.facade.plans.plan_child import FAMILY, GATED
from tests.facade.store.test_postgres_store import waiting_on_a_lock


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, db_path: pathlib.Path) -> Iterator[Store]:
    """A SQLite file, or a fresh PostgreSQL schema (skipped loudly without one)."""
    if request.param == "sqlite":
        opened: Store = SQLiteStore(db_path)
        yield opened
        opened.close()
        return
    with postgres.fresh_schema("fence") as url:
        opened = PostgresStore(url)
        try:
            yield opened
        finally:
            opened.close()


def _plan(plan_id: str = "01PLAN") -> plan_pb2.Plan:
    return plan_pb2.Plan(
        meta=common_pb2.EntityMeta(id=plan_id, namespace="default"),
        action="act",
        project="proj",
        phase=model.EXECUTE,
        state=model.RUNNING,
    )


def test_every_write_of_a_stale_holder_is_refused(store: Store) -> None:
    a, b = PlanLeases(store, 30), PlanLeases(store, 30)
    mine, theirs = PlanRecords(store, a.fence), PlanRecords(store, b.fence)
    plan = _plan()
    mine.insert(plan)
    with store.transaction():
        assert a.claim("01PLAN")
    # While a holds the lease, b (holding none) can neither claim nor write.
    with store.transaction():
        assert not b.claim("01PLAN")
    with pytest.raises(ACPError) as refused:
        theirs.save(plan)
    assert refused.value.details["refinement"] == "PLAN_LEASED"
    mine.save(plan)
    # b takes it over (as when a's process is gone): a's token is no longer current.
    with store.transaction():
        assert b.claim("01PLAN", steal_token=a.held["01PLAN"])
    step = plan_pb2.PlanStep(id="s1", tool="fs.write", state=model.SUCCEEDED)
    entry = CheckpointEntry("repo", "/r", "f", False, None, None, True, "")
    writes: list[Callable[[], object]] = [
        lambda: mine.save(plan),
        lambda: mine.save_step("01PLAN", 0, step),
        lambda: mine.save_steps("01PLAN", [step]),
        lambda: mine.save_nodes("01PLAN", [plan_pb2.DecisionNode(id="n1")]),
        lambda: mine.add_changes("01PLAN", [Change("s1", "repo", "f", b"x")]),
        lambda: mine.save_changes("01PLAN", []),
        lambda: mine.save_validations("01PLAN", [events_pb2.ValidationCompleted(validation="v")]),
        lambda: mine.save_prompt("01PLAN", plan_pb2.GetPlanPromptResponse()),
        lambda: mine.add_correction("01PLAN", plan_pb2.CorrectPlanRequest(plan_id="01PLAN")),
        lambda: mine.save_checkpoint("01PLAN", [entry]),
        lambda: mine.add_conversation("01PLAN", [{"role": "user"}]),
        lambda: mine.save_conversation("01PLAN", []),
    ]
    before = store.get("plan", "01PLAN")
    for write in writes:
        with pytest.raises(LeaseLostError):
            write()
    assert store.get("plan", "01PLAN") == before
    assert mine.steps("01PLAN") == []
    assert mine.changes("01PLAN") == []
    assert mine.checkpoint("01PLAN") == []
    # The new holder writes as usual.
    theirs.save_step("01PLAN", 0, step)
    assert theirs.steps("01PLAN") == [step]


def test_a_refused_write_undoes_the_whole_transaction(store: Store) -> None:
    a, b = PlanLeases(store, 30), PlanLeases(store, 30)
    mine = PlanRecords(store, a.fence)
    plan = _plan()
    mine.insert(plan)
    with store.transaction():
        assert a.claim("01PLAN")
    with store.transaction():
        assert b.claim("01PLAN", steal_token=a.held["01PLAN"])
    # The first write of the transaction is a store write that checks nothing itself.

    def guarded() -> None:
        with store.transaction():
            store.append_items("plan.steps", "01PLAN", [b"s"])
            mine.save(plan)

    with pytest.raises(LeaseLostError):
        guarded()
    assert store.list_items("plan.steps", "01PLAN") == []


def test_on_postgres_a_claim_waits_for_the_fenced_writes_to_commit() -> None:
    """The fence locks the lease row (FOR SHARE) until the guarded transaction ends: another
    replica's claim waits, so the holder's checked writes commit before any new token exists."""
    with postgres.fresh_schema("fence") as url:
        holder = PostgresStore(url)
        application = f"acp_claimer_{secrets.token_hex(4)}"
        claimer = PostgresStore(f"{url}&application_name={application}")
        try:
            first = holder.claim_lease("plan:01P", "one", 0.5)
            assert first is not None
            checked, release = threading.Event(), threading.Event()
            claimed: list[Lease | None] = []

            def fenced_write() -> None:
                with holder.transaction():
                    holder.check_lease("plan:01P", first.token)
                    holder.insert(_record("01W"))
                    checked.set()
                    assert release.wait(30)

            def claim() -> None:
                claimed.append(claimer.claim_lease("plan:01P", "two", 30, steal_token=first.token))

            writer = threading.Thread(target=fenced_write)
            taker = threading.Thread(target=claim)
            writer.start()
            try:
                assert checked.wait(30)
                taker.start()
                assert waiting_on_a_lock(application)
                assert claimed == []
            finally:
                release.set()
                writer.join(30)
                taker.join(30)
            assert holder.get("session", "01W") is not None
            (taken,) = claimed
            assert taken is not None
            assert taken.token == first.token + 1
            with pytest.raises(LeaseLostError), holder.transaction():
                holder.check_lease("plan:01P", first.token)
        finally:
            holder.close()
            claimer.close()


def _record(record_id: str) -> Record:
    return Record(
        kind="session", id=record_id, namespace="default", body=b"b", create_time=1.0, update_time=1.0
    )


def test_the_lease_setting_is_checked() -> None:
    assert leases.ttl_from_env({}) == leases.DEFAULT_TTL
    assert leases.ttl_from_env({leases.TTL_ENV: "2.5"}) == 2.5
    for bad in ("soon", "0.1", "7200"):
        with pytest.raises(ValueError, match=leases.TTL_ENV):
            leases.ttl_from_env({leases.TTL_ENV: bad})


def test_a_holder_is_gone_only_when_this_kernel_says_so(store: Store) -> None:
    engine = PlanLeases(store, 30)
    owner = engine.owner
    assert not leases.holder_gone(owner)
    host, kernel, pid, _, _ = owner.split("|")
    # An engine of this process that was closed.
    engine.close()
    assert leases.holder_gone(owner)
    # Another process that is alive: this test's parent.
    parent = os.getppid()
    assert not leases.holder_gone("|".join((host, kernel, str(parent), leases._started(parent), "01X")))
    # A pid reused by another process: its start time differs.
    assert leases.holder_gone("|".join((host, kernel, str(parent), "0", "01X")))
    # Another kernel or host cannot be checked from here, nor can a malformed owner.
    assert not leases.holder_gone("|".join((host, "other-boot:pid:[1]", pid, "0", "01X")))
    assert not leases.holder_gone("someone")


def test_a_holder_killed_but_not_yet_reaped_is_gone() -> None:
    """A server SIGKILLed whose parent has not waited for it yet is a zombie: gone."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        host, kernel, _, _, _ = leases.new_owner().split("|")
        owner = "|".join((host, kernel, str(child.pid), leases._started(child.pid), "01CHILD"))
        assert not leases.holder_gone(owner)
        child.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not leases.holder_gone(owner):
            assert time.monotonic() < deadline, "the killed child never counted as gone"
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait(10)


# engines on one database -----------------------------------------------------------------


def _engine(facade: ServiceFacade) -> PlanEngine:
    return next(r for r in facade._resources if isinstance(r, PlanEngine))


@dataclass
class Pair:
    """Two facades (two engines, as two processes would have) on one database."""

    facades: tuple[ServiceFacade, ServiceFacade]
    clients: tuple[ACPClient, ACPClient]


@pytest.fixture
async def two(db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Pair]:
    monkeypatch.setenv(leases.TTL_ENV, "1")
    facades = (open_facade(db_path, takeover=True), open_facade(db_path, takeover=True))
    clients = (
        ACPClient(LocalTransport(facades[0], owns_facade=True)),
        ACPClient(LocalTransport(facades[1], owns_facade=True)),
    )
    try:
        yield Pair(facades, clients)
    finally:
        for client in clients:
            await client.close()


async def _gated_plan(client: ACPClient, folder: pathlib.Path, tmp: pathlib.Path) -> str:
    write_tree(folder)
    await add_project(client, folder)
    await add_command_tool(client, "gated", [PY, "-c", GATED, "{{pid_file}}", "{{gate}}"])
    await add_profile(client, "gated", allowed_tools=["gated"])
    args = {"pid_file": str(tmp / "pid"), "gate": str(tmp / "gate")}
    await add_action(client, steps=[{"id": "wait", "tool": "gated", "args": args}], profile="gated")
    plan_id = (await use(client, {})).meta.id
    await client.call("plan.execute", plan_id=plan_id)

    async def started() -> bool:
        return (tmp / "pid").exists() and bool((tmp / "pid").read_text())

    await eventually(started)
    return plan_id


async def test_a_live_holders_plan_is_left_alone(tmp_path: pathlib.Path, two: Pair) -> None:
    first, second = two.clients
    plan_id = await _gated_plan(first, tmp_path / "repo", tmp_path)
    # Well past the lease: the first engine's heartbeat keeps it.
    await asyncio.sleep(2.5)
    assert (await status(second, plan_id)).state == model.RUNNING
    (tmp_path / "gate").touch()
    done = await wait_for(first, plan_id, model.SUCCEEDED)
    assert done.phase == model.EXECUTE
    assert "plan.error" not in [e.type for e in await plan_events(second, plan_id)]
    # Released once the run has settled (just after its last state is written).
    await eventually(lambda: _released(two.facades[1], plan_id))
    assert (await _lease(two.facades[1], plan_id)).token == 1


async def test_an_expired_holder_is_taken_over_and_its_late_writes_refused(
    tmp_path: pathlib.Path, two: Pair, caplog: pytest.LogCaptureFixture
) -> None:
    first, second = two.clients
    stale = _engine(two.facades[0])
    plan_id = await _gated_plan(first, tmp_path / "repo", tmp_path)
    token = stale.leases.held[plan_id]
    # The first engine stops renewing (as a process frozen or cut off from the database).
    assert stale.keeper.heartbeat is not None
    stale.keeper.heartbeat.cancel()
    failed = await wait_for(second, plan_id, model.FAILED)
    assert failed.last_error.code == model.INTERRUPTED
    events_then = await plan_events(second, plan_id)
    assert events_then[-1].plan_state_changed.reason == model.INTERRUPTED
    # The step finishes in the stale engine: what it would record is refused.
    (tmp_path / "gate").touch()
    task = stale.runner.task(plan_id)
    if task is not None:
        await asyncio.wait_for(asyncio.shield(task), 30)
    assert any("stopped without writing" in r.getMessage() for r in caplog.records)
    assert await status(second, plan_id) == failed
    assert await plan_events(second, plan_id) == events_then
    lease = await _lease(two.facades[1], plan_id)
    assert lease.token == token + 1
    assert not lease.owner


async def test_cancel_reaches_a_plan_another_engine_runs(tmp_path: pathlib.Path, two: Pair) -> None:
    first, second = two.clients
    plan_id = await _gated_plan(first, tmp_path / "repo", tmp_path)
    response = await second.call("plan.cancel", plan_id=plan_id, reason="enough")
    assert isinstance(response, plan_pb2.CancelPlanResponse)
    assert response.plan.state == model.CANCELLED
    changed = [e for e in await plan_events(second, plan_id) if e.type == "plan.state_changed"]
    assert changed[-1].plan_state_changed.reason == "enough"


async def _released(facade: ServiceFacade, plan_id: str) -> bool:
    return not (await _lease(facade, plan_id)).owner


async def _lease(facade: ServiceFacade, plan_id: str) -> Lease:
    found = await _engine(facade).store.read(lambda store: store.get_lease(leases.lease_name(plan_id)))
    assert found is not None
    return found


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, db_path: pathlib.Path) -> Iterator[str]:
    """A SQLite file, or a fresh PostgreSQL schema (skipped loudly without one)."""
    if request.param == "sqlite":
        yield str(db_path)
        return
    with postgres.fresh_schema("reclaim") as url:
        yield url


async def test_a_holder_whose_lease_expired_unclaimed_renews_it_and_goes_on(
    tmp_path: pathlib.Path, database: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A busy process (here: its heartbeat stopped) finds at its next write that its lease
    expired, nobody having claimed it (one process, no takeover scanner): it renews it at
    the same token and the plan completes, instead of stopping silently at RUNNING."""
    monkeypatch.setenv(leases.TTL_ENV, "0.5")
    facade = open_facade(database)
    client = ACPClient(LocalTransport(facade, owns_facade=True))
    try:
        engine = _engine(facade)
        plan_id = await _gated_plan(client, tmp_path / "repo", tmp_path)
        token = engine.leases.held[plan_id]
        assert engine.keeper.heartbeat is not None
        engine.keeper.heartbeat.cancel()

        async def expired() -> bool:
            return not (await _lease(facade, plan_id)).live

        await eventually(expired)
        (tmp_path / "gate").touch()
        done = await wait_for(client, plan_id, model.SUCCEEDED)
        assert done.progress.done == 1
        assert any(
            "had expired unrenewed and nobody had claimed it" in r.getMessage() for r in caplog.records
        )
        assert not any("stopped without writing" in r.getMessage() for r in caplog.records)
        await eventually(lambda: _released(facade, plan_id))
        assert (await _lease(facade, plan_id)).token == token
    finally:
        await client.close()


def test_a_lost_lease_says_who_holds_it_now(store: Store) -> None:
    a, b = PlanLeases(store, 30), PlanLeases(store, 30)
    with store.transaction():
        assert a.claim("01PLAN")
    token = a.held["01PLAN"]
    with store.transaction():
        assert b.claim("01PLAN", steal_token=token)
    with pytest.raises(LeaseLostError) as lost, store.transaction():
        a.fence("01PLAN")
    message = str(lost.value)
    assert f"with token {token} is lost: now held by {b.owner} at token {token + 1} (live)" in message
    expired = Lease("plan:01PLAN", a.owner, token, 1.0, live=False)
    assert f"expired unrenewed (holder {a.owner}, token {token};" in str(
        LeaseLostError("plan:01PLAN", token, expired)
    )
    released = Lease("plan:01PLAN", "", token, 0.0, live=False)
    assert str(LeaseLostError("plan:01PLAN", token, released)).endswith("is lost: it was released")


async def test_a_lost_lease_kills_the_steps_whole_process_group(tmp_path: pathlib.Path, two: Pair) -> None:
    """Issue 30 item 5: another engine takes the lease while a step's command (and its own
    child) runs; the holder's heartbeat finds it lost and the command's group is killed."""
    first, _ = two.clients
    holder, taker = _engine(two.facades[0]), _engine(two.facades[1])
    write_tree(tmp_path / "repo")
    await add_project(first, tmp_path / "repo")
    await add_command_tool(first, "family", [PY, "-c", FAMILY, "{{pids}}"])
    await add_profile(first, "family", allowed_tools=["family"])
    pids = tmp_path / "pids"
    await add_action(first, steps=[{"tool": "family", "args": {"pids": str(pids)}}], profile="family")
    plan_id = (await use(first, {})).meta.id
    await first.call("plan.execute", plan_id=plan_id)

    async def started() -> bool:
        return pids.exists()

    await eventually(started)
    family = [int(pid) for pid in pids.read_text().split()]
    token = holder.leases.held[plan_id]
    try:
        assert await taker.store.write(lambda _store: taker.leases.claim(plan_id, steal_token=token))

        async def killed() -> bool:
            return all(map(gone, family))

        await eventually(killed)
    finally:
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await taker.store.write(lambda _store: taker.leases.release(plan_id))


async def test_a_store_outage_is_one_line_for_the_lease_scanner(
    db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A database restarting fails the takeover scan every tick: one line when it starts and
    one when it ends, not a traceback a tick (issue 29)."""
    monkeypatch.setenv(leases.TTL_ENV, "1")
    failures = 3
    successes = 0
    recovered = asyncio.Event()
    loop = asyncio.get_running_loop()
    with caplog.at_level(logging.WARNING, logger="cleveragents.acp.facade.domain.plans.leasing"):
        facade = open_facade(db_path, takeover=True)
        store = _engine(facade).store
        real = store.held_leases

        def restarting(prefix: str, limit: int) -> list[Lease]:
            nonlocal failures
            if failures:
                failures -= 1
                raise StoreUnavailableError(
                    "cannot connect to postgresql://db/acp: the database system is starting up"
                )
            nonlocal successes
            successes += 1
            if successes == 2:  # the first success was logged before this second scan
                loop.call_soon_threadsafe(recovered.set)
            return real(prefix, limit)

        monkeypatch.setattr(store, "held_leases", restarting)
        try:
            await asyncio.wait_for(recovered.wait(), 20)
        finally:
            await facade.close()
    said = [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records]
    assert said[:2] == [
        (
            "WARNING",
            "plan leases: _scan cannot reach the store (cannot connect to postgresql://db/acp: the database "
            "system is starting up); retrying every 0.25 s",
            None,
        ),
        ("WARNING", "plan leases: _scan reaches the store again", None),
    ]
    assert len(said) == 2, said
