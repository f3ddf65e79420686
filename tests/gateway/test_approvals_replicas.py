"""Approvals across two real ``agents serve`` replicas on one PostgreSQL schema (issue 34):
a scripted plan whose fs.write needs an answer pauses on replica A. Eight concurrent answers
split over A and B, over HTTP and gRPC: one decision stored, seven APPROVAL_DECIDED, and the
plan resumes exactly once (one ``tool.invoked`` for the gated step, after the one
``approval.decided``), whichever replica won. And a plan paused on A, A killed with SIGKILL,
answered on B: B resumes it, once. The replicas start once for the module."""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import signal
from collections.abc import Iterator

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import approval_pb2, plan_pb2
from tests.facade.plans.helpers import add_project, write_tree
from tests.gateway.test_approvals_served import ALLOW_ONCE, envelope, grpc_client, settled, waiting
from tests.gateway.test_workers import running
from tests.postgres import fresh_schema
from tests.server_process import ServerProcess, Tokens, start_server


@dataclasses.dataclass
class Replicas:
    a: ServerProcess
    b: ServerProcess
    token: str
    directory: pathlib.Path


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    directory = tmp_path_factory.mktemp("approval-replicas")
    tokens = Tokens.create(directory)
    with (
        fresh_schema("apprreplicas") as db,
        running(start_server(directory, "--db", db, tokens=tokens.path, name="a")) as a,
        running(start_server(directory, "--db", db, tokens=tokens.path, name="b")) as b,
    ):
        yield Replicas(a, b, tokens.tokens["alice"], directory)


async def gated_world(client: ACPClient, folder: pathlib.Path, name: str) -> None:
    """Project ``name``, profile ``name`` asking before fs.write, action ``name`` writing
    NOTES.md in one step."""
    write_tree(folder)
    await add_project(client, folder, name=name, resource=name)
    await client.call("automation_profile.add", name=name, spec={"approval": {"ask": ["fs.write"]}})
    steps = [{"id": "create", "tool": "fs.write", "args": {"path": "NOTES.md", "content": "hi\n"}}]
    spec = {"actor": "scripted", "steps": steps, "automation_profile": name}
    await client.call("action.add", name=name, spec=spec)


async def plan_log(client: ACPClient, plan_id: str) -> list[tuple[str, str]]:
    """The plan's approval.decided and tool.invoked events, in order (read until quiet)."""
    found: list[tuple[str, str]] = []
    stream = aiter(client.subscribe(plan_id=plan_id))
    try:
        while True:
            try:
                event = await asyncio.wait_for(anext(stream), 1.0)
            except TimeoutError:
                return found
            if event.type == "tool.invoked":
                found.append((event.type, event.tool_invoked.step_id))
            elif event.type == "approval.decided":
                state = event.approval_decided.approval.state
                found.append((event.type, approval_pb2.ApprovalState.Name(state)))
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def resumed_once(client: ACPClient, plan_id: str) -> None:
    await settled(client, plan_id, plan_pb2.PLAN_STATE_SUCCEEDED)
    assert await plan_log(client, plan_id) == [
        ("approval.decided", "APPROVAL_STATE_ALLOWED"),
        ("tool.invoked", "create"),
    ]
    diff = await client.call("plan.diff", plan_id=plan_id)
    assert [f.path for f in diff.files] == ["NOTES.md"]  # type: ignore[attr-defined]
    listed = await client.call("approval.list", plan_id=plan_id)
    assert [a.state for a in listed.approvals] == [approval_pb2.APPROVAL_STATE_ALLOWED]  # type: ignore[attr-defined]


async def answer(client: ACPClient, approval_id: str) -> str:
    try:
        await client.call("approval.answer", approval_id=approval_id, answer=ALLOW_ONCE)
    except ACPError as exc:
        return f"{exc.code} {exc.details.get('refinement')}"
    return "decided"


@pytest.mark.timeout(120)
async def test_eight_answers_split_over_two_replicas_and_two_wires_resume_the_plan_once(
    replicas: Replicas,
) -> None:
    a = envelope(replicas.a, replicas.token)
    await gated_world(a, replicas.directory / "concurrent", "concurrent")
    plan_id, approval = await waiting(a, action="concurrent", project="concurrent")
    # Two per replica and wire: envelope A, gRPC A, envelope B, gRPC B.
    makers = (envelope, grpc_client)
    servers = (replicas.a, replicas.b)
    clients = [makers[i % 2](servers[(i // 2) % 2], replicas.token) for i in range(8)]
    try:
        outcomes = await asyncio.gather(*(answer(c, approval.id) for c in clients))
        assert sorted(outcomes) == ["INVALID_STATE APPROVAL_DECIDED"] * 7 + ["decided"], outcomes
        await resumed_once(a, plan_id)
        b = clients[2]
        assert (await b.call("plan.status", plan_id=plan_id)).plan.state == plan_pb2.PLAN_STATE_SUCCEEDED  # type: ignore[attr-defined]
    finally:
        for client in (*clients, a):
            await client.close()


# Last in the module: it kills replica A.
@pytest.mark.timeout(120)
async def test_a_plan_paused_on_a_replica_killed_9_is_resumed_once_by_the_other(
    replicas: Replicas,
) -> None:
    a = envelope(replicas.a, replicas.token)
    await gated_world(a, replicas.directory / "killed", "killed")
    plan_id, approval = await waiting(a, action="killed", project="killed")
    await a.close()
    replicas.a.process.send_signal(signal.SIGKILL)
    replicas.a.process.wait(timeout=30)
    b = grpc_client(replicas.b, replicas.token)
    try:
        shown = (await b.call("approval.show", approval_id=approval.id)).approval  # type: ignore[attr-defined]
        assert shown.state == approval_pb2.APPROVAL_STATE_PENDING
        assert await answer(b, approval.id) == "decided"
        assert await answer(b, approval.id) == "INVALID_STATE APPROVAL_DECIDED"
        await resumed_once(b, plan_id)
    finally:
        await b.close()
