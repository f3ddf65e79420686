"""A caller that stops waiting ends the wait, not the work (issue 14, item 4): ``plan.execute``
with ``wait`` over a real gRPC server with a short deadline, and over HTTP with a client that
drops its connection mid-wait. The call's server-side task ends at once; the plan's run keeps
going (a second execute sees it running), completes, and is observable by ``plan.status`` and
its events; afterwards no task of the call is left on the server's loop.

The server runs in this test's event loop (``Server`` on ephemeral loopback ports), so its
tasks are the loop's; the plan's one step is a command that waits for a file the test creates.
"""

from __future__ import annotations

import asyncio
import pathlib
import sys
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
from cleveragents.acp.v1 import plan_pb2
from tests.conformance import logged
from tests.facade.plans.helpers import (
    add_command_tool,
    add_project,
    eventually,
    plan_events,
    status,
    wait_for,
)
from tests.server_process import Tokens

# Waits for the file named by its argument (bounded), then exits 0.
GATE = (
    "import os, sys, time\n"
    "deadline = time.monotonic() + 120\n"
    "while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:\n"
    "    time.sleep(0.02)\n"
    "sys.exit(0 if os.path.exists(sys.argv[1]) else 1)\n"
)
# Longer than the server needs to start the run on a loaded machine; the gate holds the run.
WAIT_SECONDS = 3.0


@dataclass
class Served:
    server: Server
    http_url: str
    grpc_target: str
    token: str
    client: ACPClient
    folder: pathlib.Path


@pytest.fixture
async def served(tmp_path: pathlib.Path) -> AsyncIterator[Served]:
    tokens = Tokens.create(tmp_path)
    facade = open_facade(tmp_path / "acp.db", authenticator=TokenAuthenticator(tokens.path))
    config = ServerConfig(host="127.0.0.1", http_port=0, grpc_port=0, grace_seconds=1.0)
    server = Server(config, facade=facade, observability=logged.observability())
    addresses = await server.start()
    assert addresses.grpc_target is not None
    client = ACPClient(GrpcTransport.connect(addresses.grpc_target, timeout=30), token=tokens.tokens["alice"])
    try:
        yield Served(
            server, addresses.http_url, addresses.grpc_target, tokens.tokens["alice"], client, tmp_path
        )
    finally:
        await client.close()
        await server.stop()


async def _gated_plan(served: Served) -> tuple[str, pathlib.Path]:
    """A plan whose one step waits for the returned path to exist."""
    project = served.folder / "project"
    project.mkdir()
    gate = served.folder / "gate"
    await add_project(served.client, project)
    await add_command_tool(
        served.client, "gate", [sys.executable, "-c", GATE, str(gate)], timeout_seconds=120
    )
    await served.client.call("automation_profile.add", name="gated", spec={"allowed_tools": ["gate"]})
    spec = {"actor": "scripted", "automation_profile": "gated", "steps": [{"id": "gate", "tool": "gate"}]}
    await served.client.call("action.add", name="act", spec=spec)
    used = await served.client.call("plan.use", action="act", project="proj")
    assert isinstance(used, plan_pb2.UsePlanResponse)
    return used.plan.meta.id, gate


# What runs a call on the server: uvicorn's task per HTTP request, grpc.aio's two per RPC.
CALL_TASKS = frozenset({"RequestResponseCycle.run_asgi", "_schedule_rpc_coro", "_handle_exceptions"})
# grpc.aio's server always has one task waiting for the next RPC (a new one after each).
IDLE_TASKS = frozenset({"AioServer._request_call"})


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
    served: Served, plan_id: str, gate: pathlib.Path, tasks: Callable[[], dict[str, str]]
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
    await asyncio.to_thread(gate.touch)
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
    plan_id, gate = await _gated_plan(served)
    tasks = _tasks_beyond(set(asyncio.all_tasks()))
    short = GrpcTransport.connect(served.grpc_target, timeout=WAIT_SECONDS, retry=RetryPolicy.OFF)
    async with ACPClient(short, token=served.token) as impatient:
        call = asyncio.create_task(impatient.call("plan.execute", plan_id=plan_id, wait=True))
        await _until(lambda: "_schedule_rpc_coro" in tasks().values(), tasks, "no task ran the call")
        with pytest.raises(ACPError) as raised:
            await call
    assert raised.value.grpc_status == "DEADLINE_EXCEEDED"
    await _outlives_its_caller(served, plan_id, gate, tasks)


async def test_an_http_disconnect_ends_the_wait_not_the_run(served: Served) -> None:
    plan_id, gate = await _gated_plan(served)
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
    await _outlives_its_caller(served, plan_id, gate, tasks)
