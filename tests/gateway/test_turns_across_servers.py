"""Double texting across real ``agents serve`` processes (issue 33): the first tell reaches
one process and the second another while the first turn's model call is in flight on the
fake OpenAI server, under ``--workers 2`` on one SQLite file and with two replicas on one
PostgreSQL schema. For each multitask policy the stored history, each model request's
messages, the turn states and the events are exactly as in-process (tests/conformance/
test_turns.py).

That the tells really reach two processes is checked, not hoped for: each client holds one
keep-alive connection, and for ``--workers`` the test learns which worker holds it from the
workers' own metrics listeners (a probe call moves one worker's request count); the store
then shows the first turn's run lease held by one process and the second turn's by the
other (a lease's owner names its pid), and each worker counted one tell."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import pathlib
import signal
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.contract.retry import RetryPolicy
from cleveragents.acp.facade.domain.plans import leases
from cleveragents.acp.facade.domain.sessions import turns
from cleveragents.acp.facade.factory import open_store
from cleveragents.acp.facade.store.base import EventFilter
from cleveragents.acp.v1 import events_pb2, session_pb2
from tests.chaos.processes import free_port
from tests.conformance.test_turns import TURN_EVENTS, collect, ended, held, said, shown, summary
from tests.facade.plans.model_world import KEY, KEY_ENV
from tests.facade.plans.test_lease_processes import _write_locks as write_locks
from tests.fake_openai import FakeOpenAI, eventually, turn
from tests.gateway.test_workers import free_port_pair, per_worker, running
from tests.postgres import fresh_schema
from tests.server_process import ServerProcess, Tokens, start_server

USER, ORCH = session_pb2.MESSAGE_ROLE_USER, session_pb2.MESSAGE_ROLE_ORCHESTRATOR
TIMEOUT = 30.0
# Fresh connections tried before giving up on reaching both workers (1/2 each).
MAX_TRIES = 60
# The servers' lease time ($ACP_PLAN_LEASE_SECONDS): how long a frozen process keeps its turn.
TTL = 3.0


@dataclasses.dataclass
class Processes:
    """Two server processes on one store, and where the test finds them."""

    kind: str
    db: str
    pids: tuple[int, int]
    # One base URL per process (both the same for --workers: the kernel picks the worker).
    urls: tuple[str, str]
    token: str
    fake_port: int
    # --workers: worker i's metrics listener is on metrics_port + i.
    metrics_port: int = 0


@pytest.fixture(scope="module", params=["workers", "replicas"])
def processes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Processes]:
    directory = tmp_path_factory.mktemp(request.param)
    tokens = Tokens.create(directory)
    fake_port = free_port()
    allow = [
        "--model-endpoint",
        f"http://127.0.0.1:{fake_port}/v1",
        "--model-key-env",
        KEY_ENV,
        "--idle-timeout",
        "600",
    ]
    env = {KEY_ENV: KEY, leases.TTL_ENV: str(TTL)}
    token = tokens.tokens["alice"]
    if request.param == "workers":
        db = str(directory / "acp.db")
        metrics_port = free_port_pair()
        extra = ["--db", db, "--workers", "2", "--metrics-port", str(metrics_port), *allow]
        with running(start_server(directory, *extra, tokens=tokens.path, env=env)) as server:
            pids = ready_pids(server)
            yield Processes("workers", db, pids, (server.http, server.http), token, fake_port, metrics_port)
        return
    with fresh_schema("turnreplicas") as db:
        extra = ["--db", db, *allow]
        with (
            running(start_server(directory, *extra, tokens=tokens.path, env=env, name="a")) as first,
            running(start_server(directory, *extra, tokens=tokens.path, env=env, name="b")) as second,
        ):
            pids = (first.process.pid, second.process.pid)
            yield Processes("replicas", db, pids, (first.http, second.http), token, fake_port)


def ready_pids(server: ServerProcess) -> tuple[int, int]:
    line = next(line for line in server.stdout if line.startswith("acp-ready "))
    first, second = json.loads(line.removeprefix("acp-ready "))["workers"]
    return int(first), int(second)


def pinned(url: str, token: str) -> ACPClient:
    """A client on one keep-alive connection that is never retried elsewhere."""
    http = httpx.AsyncClient(
        base_url=url,
        timeout=httpx.Timeout(TIMEOUT),
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=600),
    )
    return ACPClient(HTTPTransport(http, owns_client=True, retry=RetryPolicy.OFF), token=token)


async def served_lists(where: Processes) -> list[float]:
    return await asyncio.to_thread(
        per_worker, where.metrics_port, "acp_requests_total", operation="session.list"
    )


async def tells(where: Processes) -> list[float]:
    return await asyncio.to_thread(
        per_worker, where.metrics_port, "acp_requests_total", operation="session.tell"
    )


@pytest.fixture
async def sides(processes: Processes) -> AsyncIterator[tuple[ACPClient, ACPClient]]:
    """A client pinned to each process: index 0 reaches pid 0, index 1 pid 1."""
    made: list[ACPClient] = []
    found: dict[int, ACPClient] = {}
    try:
        if processes.kind == "replicas":
            for url in processes.urls:
                made.append(pinned(url, processes.token))
            found = dict(enumerate(made))
        else:
            for _ in range(MAX_TRIES):
                client = pinned(processes.urls[0], processes.token)
                made.append(client)
                before = await served_lists(processes)
                await client.call("session.list")
                after = await served_lists(processes)
                (worker,) = [i for i in range(2) if after[i] > before[i]]
                found.setdefault(worker, client)
                if len(found) == 2:
                    break
            assert len(found) == 2, "no connection reached the second worker"
        yield found[0], found[1]
    finally:
        for client in made:
            await client.close()


async def lease_pid(where: Processes, name: str) -> int:
    """The pid of the process holding a live lease (its owner is host|kernel|pid|start|engine)."""

    def read() -> int:
        store = open_store(where.db)
        try:
            lease = store.get_lease(name)
        finally:
            store.close()
        assert lease is not None
        assert lease.live, lease
        return int(lease.owner.split("|")[2])

    return await asyncio.to_thread(read)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("policy", ["enqueue", "reject", "interrupt", "rollback"])
async def test_double_texting_across_processes(
    processes: Processes, sides: tuple[ACPClient, ACPClient], policy: str
) -> None:
    one_side, other_side = sides
    # The events are read on any process (every process follows every other's).
    watcher = ACPClient(
        HTTPTransport(
            httpx.AsyncClient(base_url=processes.urls[0], timeout=httpx.Timeout(TIMEOUT)), owns_client=True
        ),
        token=processes.token,
    )
    release_one, release_two = asyncio.Event(), asyncio.Event()
    told_before = await tells(processes) if processes.kind == "workers" else []
    try:
        async with FakeOpenAI(processes.fake_port) as fake:
            await one_side.call(
                "actor.add",
                name=f"chat-{policy}",
                spec={"provider": "openai", "model": "m", "base_url": fake.base_url, "api_key_env": KEY_ENV},
            )
            created = await one_side.call("session.create", orchestrator=f"chat-{policy}")
            assert isinstance(created, session_pb2.CreateSessionResponse)
            sid = created.session.meta.id
            fake.then(held("Answer one.", release_one, after=2), held("Answer two.", release_two, after=2))
            events = aiter(watcher.subscribe(session_id=sid, event_type=TURN_EVENTS))
            deltas = aiter(watcher.subscribe(session_id=sid, event_type=["session.text_delta"]))
            first = asyncio.ensure_future(one_side.call("session.tell", session_id=sid, content="Q1"))
            (delta,) = await collect(deltas, 1)
            assert delta.session_text_delta.text == "Answ"
            one_id = delta.session_text_delta.turn_id
            # The first turn runs in the process the first tell reached.
            assert await lease_pid(processes, turns.run_lease(sid)) == processes.pids[0]

            multitask = f"MULTITASK_POLICY_{policy.upper()}"
            if policy == "reject":
                with pytest.raises(ACPError) as refused:
                    await other_side.call("session.tell", session_id=sid, content="Q2", multitask=multitask)
                assert refused.value.code == "INVALID_STATE"
                assert refused.value.details["refinement"] == "TURN_IN_PROGRESS"
                assert refused.value.details["turn_id"] == one_id
                release_one.set()
                answer = await first
                assert isinstance(answer, session_pb2.TellSessionResponse)
                assert answer.turn.state == session_pb2.TURN_STATE_SUCCEEDED
                stored = (await shown(other_side, sid)).messages
                assert [(m.role, m.content) for m in stored] == [(USER, "Q1"), (ORCH, "Answer one.")]
                assert len(fake.requests) == 1
                await told_once_each(processes, told_before)
                print(
                    f"{processes.kind} reject: Q1 -> pid {processes.pids[0]}, Q2 -> pid {processes.pids[1]} "
                    f"refused {refused.value.details['refinement']}; history {[m.content for m in stored]}"
                )
                return

            second = await other_side.call(
                "session.tell", session_id=sid, content="Q2", multitask=multitask, background=True
            )
            assert isinstance(second, session_pb2.TellSessionResponse)
            assert second.turn.state == session_pb2.TURN_STATE_QUEUED
            two_id = second.turn.id
            if policy == "enqueue":
                # Queued behind the first turn, held by the process that accepted it.
                assert await lease_pid(processes, turns.queue_lease(two_id)) == processes.pids[1]
                release_one.set()
            answer = await first
            assert isinstance(answer, session_pb2.TellSessionResponse)
            assert answer.turn.id == one_id
            # The second turn runs in the process the second tell reached.
            await eventually(lambda: len(fake.requests) == 2, TIMEOUT)
            assert await lease_pid(processes, turns.run_lease(sid)) == processes.pids[1]
            release_two.set()
            two = await ended(one_side, sid, two_id)
            assert two.state == session_pb2.TURN_STATE_SUCCEEDED
            one = answer.turn
            view = await shown(one_side, sid)
            history = [(m.role, m.content, m.partial) for m in view.messages]
            requests = [said(body) for body in fake.bodies()]
            assert len(requests) == 2
            assert requests[0] == [("user", "Q1")]
            if policy == "enqueue":
                assert one.state == session_pb2.TURN_STATE_SUCCEEDED
                assert history == [
                    (USER, "Q1", False),
                    (ORCH, "Answer one.", False),
                    (USER, "Q2", False),
                    (ORCH, "Answer two.", False),
                ]
                assert requests[1] == [("user", "Q1"), ("assistant", "Answer one."), ("user", "Q2")]
            elif policy == "interrupt":
                assert one.state == session_pb2.TURN_STATE_INTERRUPTED
                assert history == [
                    (USER, "Q1", False),
                    (ORCH, "Answ", True),
                    (USER, "Q2", False),
                    (ORCH, "Answer two.", False),
                ]
                assert requests[1] == [("user", "Q1"), ("assistant", "Answ"), ("user", "Q2")]
            else:
                assert one.state == session_pb2.TURN_STATE_CANCELLED
                assert history == [(USER, "Q2", False), (ORCH, "Answer two.", False)]
                assert requests[1] == [("user", "Q2")]
            by_id = {m.id: m for m in view.messages}
            for m in view.messages:
                if m.role == ORCH:
                    assert by_id[m.in_reply_to].turn_id == m.turn_id
            assert [t.id for t in view.turns] == ([one_id, two_id] if policy != "rollback" else [two_id])
            if policy != "enqueue":
                # The stop reached the first process's runner, which closed its model stream.
                await eventually(lambda: fake.dropped >= 1, TIMEOUT)

            seen = summary(await collect(events, 8 if policy != "rollback" else 7))
            head = [
                ("session.turn_started", "TURN_STATE_RUNNING"),
                ("session.message", "MESSAGE_ROLE_USER:Q1"),
            ]
            if policy == "enqueue":
                head.append(("session.message", "MESSAGE_ROLE_ORCHESTRATOR:Answer one."))
            elif policy == "interrupt":
                head.append(("session.message", "MESSAGE_ROLE_ORCHESTRATOR:Answ"))
            assert seen == [
                *head,
                ("session.turn_completed", session_pb2.TurnState.Name(one.state)),
                ("session.turn_started", "TURN_STATE_RUNNING"),
                ("session.message", "MESSAGE_ROLE_USER:Q2"),
                ("session.message", "MESSAGE_ROLE_ORCHESTRATOR:Answer two."),
                ("session.turn_completed", "TURN_STATE_SUCCEEDED"),
            ]
            await told_once_each(processes, told_before)
            print(
                f"{processes.kind} {policy}: Q1 -> pid {processes.pids[0]}, Q2 -> pid {processes.pids[1]}; "
                f"turns {[session_pb2.TurnState.Name(t.state) for t in view.turns]}; "
                f"history {[(m.content, m.partial) for m in view.messages]}; "
                f"second model request {requests[1]}"
            )
    finally:
        release_one.set()
        release_two.set()
        await watcher.close()


async def told_once_each(where: Processes, before: list[float]) -> None:
    """--workers: each worker served one of the two tells (replicas: two ports by construction)."""
    if where.kind == "workers":
        after = await tells(where)
        assert [after[i] - before[i] for i in range(2)] == [1, 1]


def freeze(pid: int, db: str) -> None:
    """SIGSTOP ``pid`` at an instant it holds no SQLite write lock (a process frozen inside a
    SQLite write stops every writer of the file: no takeover is possible, none is claimed;
    docs/server.md, "A locked database"). PostgreSQL ends such a transaction itself."""
    paths = [] if "://" in db else [db, f"{db}-shm", f"{db}-wal"]
    for _ in range(100):
        os.kill(pid, signal.SIGSTOP)
        while pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
            time.sleep(0.001)
        if not write_locks(pid, paths):
            return
        os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)
    raise AssertionError(f"process {pid} held a SQLite write lock at each of 100 stops")


async def session_events(where: Processes, session_id: str) -> list[events_pb2.Event]:
    """The session's events as stored (no stream: a frozen process may be serving it)."""

    def read() -> list[events_pb2.Event]:
        store = open_store(where.db)
        try:
            stored = store.read_events(0, 10_000, EventFilter(session_id=session_id))
        finally:
            store.close()
        return [events_pb2.Event.FromString(e.body) for e in stored]

    return await asyncio.to_thread(read)


@pytest.mark.timeout(180)
async def test_a_frozen_turn_runner_is_taken_over_and_writes_nothing_after(
    processes: Processes, sides: tuple[ACPClient, ACPClient]
) -> None:
    """SIGSTOP of the process running a session's turn (it holds the run lease): once the
    lease lapses ($ACP_PLAN_LEASE_SECONDS) the other process's queued turn ends the frozen
    one as failed and runs; on SIGCONT the frozen process stores nothing more (its model
    answer completes, but its fenced writes are refused), and its caller is told the turn's
    stored end."""
    one_side, other_side = sides
    release_one = asyncio.Event()
    frozen = processes.pids[0]
    async with FakeOpenAI(processes.fake_port) as fake:
        await one_side.call(
            "actor.add",
            name="chat-frozen",
            spec={"provider": "openai", "model": "m", "base_url": fake.base_url, "api_key_env": KEY_ENV},
        )
        created = await one_side.call("session.create", orchestrator="chat-frozen")
        assert isinstance(created, session_pb2.CreateSessionResponse)
        sid = created.session.meta.id
        fake.then(held("Answer one.", release_one, after=2), turn("Answer two."))
        first = asyncio.ensure_future(one_side.call("session.tell", session_id=sid, content="Q1"))
        # Mid-turn: the first piece of the answer is stored (its delta event).
        for _ in range(int(TIMEOUT / 0.05)):
            streamed = [e for e in await session_events(processes, sid) if e.session_text_delta.text]
            if streamed:
                break
            await asyncio.sleep(0.05)
        assert [e.session_text_delta.text for e in streamed] == ["Answ"]
        one_id = streamed[0].session_text_delta.turn_id
        assert await lease_pid(processes, turns.run_lease(sid)) == frozen
        await asyncio.to_thread(freeze, frozen, processes.db)
        try:
            frozen_at = time.monotonic()
            second = await other_side.call("session.tell", session_id=sid, content="Q2", background=True)
            assert isinstance(second, session_pb2.TellSessionResponse)
            one = await ended(other_side, sid, one_id)
            settled = time.monotonic() - frozen_at
            two = await ended(other_side, sid, second.turn.id)
            taken_over = time.monotonic() - frozen_at
        finally:
            os.kill(frozen, signal.SIGCONT)
        assert two.state == session_pb2.TURN_STATE_SUCCEEDED
        # The frozen process wakes; its model stream is let through to the end.
        release_one.set()
        answer = await first
        assert isinstance(answer, session_pb2.TellSessionResponse)
        assert answer.turn.state == session_pb2.TURN_STATE_FAILED
        assert answer.turn.error.message == "the server process running it stopped"
        assert not answer.replies
        view = await shown(other_side, sid)
        assert [(m.role, m.content) for m in view.messages] == [
            (USER, "Q1"),
            (USER, "Q2"),
            (ORCH, "Answer two."),
        ]
        assert [t.state for t in view.turns] == [
            session_pb2.TURN_STATE_FAILED,
            session_pb2.TURN_STATE_SUCCEEDED,
        ]
        stored = await session_events(processes, sid)
        # Of the first turn's answer only what streamed before the freeze: the frozen
        # process's deltas after it are fenced out like its replies.
        one_deltas = [
            e.session_text_delta.text for e in stored if e.session_text_delta.turn_id == answer.turn.id
        ]
        assert one_deltas == ["Answ"]
        assert summary([e for e in stored if e.type in TURN_EVENTS]) == [
            ("session.turn_started", "TURN_STATE_RUNNING"),
            ("session.message", "MESSAGE_ROLE_USER:Q1"),
            ("session.turn_completed", "TURN_STATE_FAILED"),
            ("session.turn_started", "TURN_STATE_RUNNING"),
            ("session.message", "MESSAGE_ROLE_USER:Q2"),
            ("session.message", "MESSAGE_ROLE_ORCHESTRATOR:Answer two."),
            ("session.turn_completed", "TURN_STATE_SUCCEEDED"),
        ]
        print(
            f"{processes.kind}: SIGSTOP + {settled:.2f} s: the frozen turn ended {one.error.message!r}; "
            f"+ {taken_over:.2f} s: the next turn answered (lease {TTL} s)"
        )
