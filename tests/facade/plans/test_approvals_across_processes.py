"""Approvals across processes: two facades (two stores, two plan engines, as two ``--workers``
processes on one SQLite file or two replicas on one PostgreSQL schema). The plan pauses in
one; eight answers split between both: one decision stored, seven APPROVAL_DECIDED, the plan
resumed once (through its lease), whichever process won."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import approval_pb2, plan_pb2
from tests.facade.plans.helpers import (
    add_action,
    add_profile,
    add_project,
    plan_events,
    use,
    wait_for,
    write_tree,
)
from tests.postgres import fresh_schema


@pytest.fixture(params=["sqlite", "postgres"])
async def pair(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> AsyncIterator[tuple[ACPClient, ACPClient]]:
    if request.param == "sqlite":
        where = str(tmp_path / "acp.db")
        schema = None
    else:
        schema = fresh_schema("approvals")
        where = schema.__enter__()
    first = ACPClient(LocalTransport(open_facade(where), owns_facade=True))
    second = ACPClient(LocalTransport(open_facade(where), owns_facade=True))
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()
        if schema is not None:
            schema.__exit__(None, None, None)


async def test_eight_answers_through_two_processes_resume_the_plan_once(
    pair: tuple[ACPClient, ACPClient], tmp_path: pathlib.Path
) -> None:
    one, other = pair
    folder = tmp_path / "project"
    write_tree(folder)
    await add_project(one, folder)
    await add_profile(one, "gated", approval={"ask": ["fs.write"]})
    await add_action(one, profile="gated")
    plan = await use(one)
    paused = await one.call("plan.execute", plan_id=plan.meta.id, wait=True)
    assert paused.plan.state == plan_pb2.PLAN_STATE_AWAITING_APPROVAL  # type: ignore[attr-defined]
    listed = await other.call("approval.list", plan_id=plan.meta.id)
    [approval] = listed.approvals  # type: ignore[attr-defined]

    async def answer(client: ACPClient) -> str:
        try:
            await client.call(
                "approval.answer", approval_id=approval.id, answer=approval_pb2.APPROVAL_ANSWER_ALLOW_ONCE
            )
        except ACPError as exc:
            return f"{exc.code} {exc.details.get('refinement')}"
        return "decided"

    outcomes = await asyncio.gather(*(answer(one if i % 2 else other) for i in range(8)))
    assert sorted(outcomes) == ["INVALID_STATE APPROVAL_DECIDED"] * 7 + ["decided"], outcomes
    await wait_for(one, plan.meta.id, plan_pb2.PLAN_STATE_SUCCEEDED, seconds=30)
    events = await plan_events(one, plan.meta.id)
    assert [e.tool_invoked.step_id for e in events if e.type == "tool.invoked"] == [
        "create",
        "modify",
        "delete",
    ]
    assert sum(1 for e in events if e.type == "approval.decided") == 1
