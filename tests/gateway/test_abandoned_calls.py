"""A caller that stops waiting ends the wait, not the work (issue 14, item 4): ``plan.execute``
with ``wait`` over a real gRPC server with a short deadline, and over HTTP with a client that
drops its connection mid-wait. The call's server-side task ends at once; the plan's run keeps
going (a second execute sees it running), completes, and is observable by ``plan.status`` and
its events; afterwards no task of the call is left on the server's loop.

The server runs in this test's event loop (``Server`` on ephemeral loopback ports), so its
tasks are the loop's. The plan's actor is a model on the fake OpenAI server, which holds its
answer until the test lets it go: the run is in flight for as long as the test needs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract.errors import ACPError, TransportError
from cleveragents.acp.contract.retry import RetryPolicy
from cleveragents.acp.facade.auth import TokenAuthenticator
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.gateway.server import Server, ServerConfig
from cleveragents.acp.v1 import plan_pb2, session_pb2
from tests.conformance import logged
from tests.facade.plans.helpers import eventually, plan_events, status, wait_for
from tests.facade.plans.model_world import KEY, KEY_ENV, model_world
from tests.fake_openai import FakeOpenAI, turn
from tests.server_process import Tokens

# Longer than the server needs to start the run on a loaded machine; the model holds the run.
WAIT_SECONDS = 3.0


@dataclass
class Served:
    server: Server
    http_url: str
    grpc_target: str
    token: str
    client: ACPClient
    folder: pathlib.Path
    model: FakeOpenAI


@pytest.fixture
async def served(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Served]:
    monkeypatch.setenv(KEY_ENV, KEY)
    tokens = Tokens.create(tmp_path)
    facade = open_facade(tmp_path / "acp.db", authenticator=TokenAuthenticator(tokens.path))
    config = ServerConfig(host="127.0.0.1", http_port=0, grpc_port=0, grace_seconds=1.0)
    server = Server(config, facade=facade, observability=logged.observability())
    addresses = await server.start()
    assert addresses.grpc_target is not None
    client = ACPClient(GrpcTransport.connect(addresses.grpc_target, timeout=30), token=tokens.tokens["alice"])
    model = await FakeOpenAI().start()
    try:
        yield Served(
            server, addresses.http_url, addresses.grpc_target, tokens.tokens["alice"], client, tmp_path, model
        )
    finally:
        await client.close()
        await server.stop()
        await model.close()


async def _held_plan(served: Served) -> tuple[str, asyncio.Event]:
    """A plan whose model answers ("done", no tool calls) once the returned event is set."""
    await model_world(served.client, served.folder / "project", served.model.base_url)
    release = asyncio.Event()
    served.model.then(dataclasses.replace(turn("Nothing to change."), hold=release))
    used = await served.client.call("plan.use", action="act", project="proj", inputs={"word": "old"})
    assert isinstance(used, plan_pb2.UsePlanResponse)
    return used.plan.meta.id, release


# What runs a call on the server: uvicorn's task per HTTP request, grpc.aio's two per RPC.
CALL_TASKS = frozenset({"RequestResponseCycle.run_asgi", "_schedule_rpc_coro", "_handle_exceptions"})
# grpc.aio's server always has one task waiting for the next RPC (a new one after each); the
# fake model server keeps its connection from the run open (it is not the ACP server's).
IDLE_TASKS = frozenset({"AioServer._request_call", "FakeOpenAI._connection"})


def _tasks_beyond(baseline: set[asyncio.Task[object]]) -> Callable[[], dict[str, str]]:
    """The loop's unfinished tasks that were not there at the start: name -> coroutine."""
    current = asyncio.current_task()

    def found() -> dict[str, str]:
        return {
            t.get_name(): getattr(t.get_coro(), "__qualname__", "?")
            for t in asyncio.all_tasks()
            if t not in baseline and t is not current and not t.done()
        }

    return found


async def _until(check: Callable[[], bool], tasks: Callable[[], dict[str, str]], what: str) -> None:
    async def met() -> bool:
        return check()

    try:
        await eventually(met, seconds=30)
    except TimeoutError:
        raise AssertionError(f"{what}; the tasks beyond the start: {tasks()}") from None


async def _outlives_its_caller(
    served: Served, plan_id: str, release: asyncio.Event, tasks: Callable[[], dict[str, str]]
) -> None:
    """After the caller left: the call's task ends while the run goes on; the state is
    consistent; the run completes and is observable; then nothing of the call is left."""
    run = f"plan-{plan_id}"
    await _until(
        lambda: run in tasks() and not CALL_TASKS & set(tasks().values()), tasks, "the call kept waiting"
    )
    assert (await status(served.client, plan_id)).state == plan_pb2.PLAN_STATE_RUNNING
    with pytest.raises(ACPError) as again:
        await served.client.call("plan.execute", plan_id=plan_id)
    assert again.value.code == "INVALID_STATE"
    release.set()
    done = await wait_for(served.client, plan_id, plan_pb2.PLAN_STATE_SUCCEEDED, seconds=60)
    assert done.phase == plan_pb2.PLAN_PHASE_EXECUTE
    events = await plan_events(served.client, plan_id)
    changes = [
        (e.plan_state_changed.phase, e.plan_state_changed.to_state)
        for e in events
        if e.HasField("plan_state_changed")
    ]
    assert changes[-1] == (plan_pb2.PLAN_PHASE_EXECUTE, plan_pb2.PLAN_STATE_SUCCEEDED)
    await _until(lambda: set(tasks().values()) <= IDLE_TASKS, tasks, "tasks were left behind")


async def test_a_grpc_deadline_ends_the_wait_not_the_run(served: Served) -> None:
    plan_id, release = await _held_plan(served)
    tasks = _tasks_beyond(set(asyncio.all_tasks()))
    short = GrpcTransport.connect(served.grpc_target, timeout=WAIT_SECONDS, retry=RetryPolicy.OFF)
    async with ACPClient(short, token=served.token) as impatient:
        call = asyncio.create_task(impatient.call("plan.execute", plan_id=plan_id, wait=True))
        await _until(lambda: "_schedule_rpc_coro" in tasks().values(), tasks, "no task ran the call")
        with pytest.raises(ACPError) as raised:
            await call
    assert raised.value.grpc_status == "DEADLINE_EXCEEDED"
    await _outlives_its_caller(served, plan_id, release, tasks)


async def test_an_http_disconnect_ends_the_wait_not_the_run(served: Served) -> None:
    plan_id, release = await _held_plan(served)
    tasks = _tasks_beyond(set(asyncio.all_tasks()))
    # The client gives up reading after WAIT_SECONDS and closes its connection.
    http = httpx.AsyncClient(base_url=served.http_url, timeout=httpx.Timeout(30, read=WAIT_SECONDS))
    async with ACPClient(HTTPTransport(http, owns_client=True), token=served.token) as impatient:
        call = asyncio.create_task(impatient.call("plan.execute", plan_id=plan_id, wait=True))
        await _until(
            lambda: "RequestResponseCycle.run_asgi" in tasks().values(), tasks, "no task ran the call"
        )
        with pytest.raises(TransportError) as raised:
            await call
    assert raised.value.details["cause"] == "ReadTimeout"
    await _outlives_its_caller(served, plan_id, release, tasks)


async def test_a_turn_whose_caller_left_stores_its_replies(served: Served) -> None:
    """``session.tell`` over gRPC, deadline passed while the model answers: the turn finishes
    on its own; the message and the reply are stored, as ``session.show`` shows."""
    await model_world(served.client, served.folder / "project", served.model.base_url)
    spec = {
        "provider": "openai",
        "model": "fake-model",
        "base_url": served.model.base_url,
        "api_key_env": KEY_ENV,
    }
    await served.client.call("actor.add", name="chat", spec=spec)
    created = await served.client.call("session.create", project="proj", orchestrator="chat")
    assert isinstance(created, session_pb2.CreateSessionResponse)
    session_id = created.session.meta.id
    release = asyncio.Event()
    served.model.then(dataclasses.replace(turn("Hello back."), hold=release))
    tasks = _tasks_beyond(set(asyncio.all_tasks()))
    short = GrpcTransport.connect(served.grpc_target, timeout=WAIT_SECONDS, retry=RetryPolicy.OFF)
    async with ACPClient(short, token=served.token) as impatient:
        with pytest.raises(ACPError) as raised:
            await impatient.call("session.tell", session_id=session_id, content="Hello?")
    assert raised.value.grpc_status == "DEADLINE_EXCEEDED"
    await _until(lambda: not CALL_TASKS & set(tasks().values()), tasks, "the call kept waiting")
    release.set()

    async def replied() -> bool:
        shown = await served.client.call("session.show", session_id=session_id)
        assert isinstance(shown, session_pb2.GetSessionResponse)
        return [(m.role, m.content) for m in shown.messages] == [
            (session_pb2.MESSAGE_ROLE_USER, "Hello?"),
            (session_pb2.MESSAGE_ROLE_ORCHESTRATOR, "Hello back."),
        ]

    await eventually(replied, seconds=30)
    await _until(lambda: set(tasks().values()) <= IDLE_TASKS, tasks, "tasks were left behind")
