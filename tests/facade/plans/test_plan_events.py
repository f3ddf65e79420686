"""A plan's events arrive in causal order, carry the plan and session ids, and a
session's ``/use`` starts a plan."""

from __future__ import annotations

import asyncio
import pathlib

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.v1 import events_pb2, plan_pb2, session_pb2
from tests.facade.plans.helpers import (
    SCHEMA,
    add_action,
    add_project,
    plan_events,
    run,
    snapshot,
    status,
    write_tree,
)

EXPECTED = [
    ("plan.created", ""),
    ("plan.state_changed", "strategize pending->running"),
    ("plan.decision_made", "d1"),
    ("plan.decision_made", "d2"),
    ("plan.decision_made", "d3"),
    ("plan.decision_made", "d4"),
    ("plan.state_changed", "strategize running->succeeded"),
    ("plan.phase_changed", "strategize->execute"),
    ("plan.state_changed", "execute succeeded->running"),
    ("tool.invoked", "create"),
    ("tool.completed", "create"),
    ("tool.invoked", "modify"),
    ("tool.completed", "modify"),
    ("tool.invoked", "delete"),
    ("tool.completed", "delete"),
    ("validation.completed", "heading"),
    ("plan.state_changed", "execute running->succeeded"),
    ("plan.phase_changed", "execute->apply"),
    ("plan.state_changed", "apply succeeded->running"),
    ("plan.apply_completed", ""),
    ("plan.state_changed", "apply running->succeeded"),
    ("plan.state_changed", "apply succeeded->rolled_back"),
]


def _word(enum: type, value: int, prefix: str) -> str:
    return str(enum.Name(value)).removeprefix(prefix).lower()  # type: ignore[attr-defined]


def describe(event: events_pb2.Event) -> tuple[str, str]:
    payload = event.WhichOneof("payload")
    if payload == "plan_state_changed":
        change = event.plan_state_changed
        phase = _word(plan_pb2.PlanPhase, change.phase, "PLAN_PHASE_")
        old = _word(plan_pb2.PlanState, change.from_state, "PLAN_STATE_")
        new = _word(plan_pb2.PlanState, change.to_state, "PLAN_STATE_")
        return event.type, f"{phase} {old}->{new}"
    if payload == "plan_phase_changed":
        moved = event.plan_phase_changed
        old = _word(plan_pb2.PlanPhase, moved.from_phase, "PLAN_PHASE_")
        new = _word(plan_pb2.PlanPhase, moved.to_phase, "PLAN_PHASE_")
        return event.type, f"{old}->{new}"
    if payload == "plan_decision_made":
        return event.type, event.plan_decision_made.node.id
    if payload == "tool_invoked":
        return event.type, event.tool_invoked.step_id
    if payload == "tool_completed":
        return event.type, event.tool_completed.step_id
    if payload == "validation_completed":
        return event.type, event.validation_completed.validation
    return event.type, ""


async def test_events_of_a_plan_arrive_in_causal_order(client: ACPClient, tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "repo"
    write_tree(folder)
    await add_project(client, folder)
    await client.call(
        "validation.add",
        name="heading",
        spec={"paths": ["docs/*"], "regex": {"pattern": "^# ", "must_match": True}},
    )
    await add_action(client, schema=SCHEMA, validations=["heading"])
    created = await client.call("session.create", project="proj")
    assert isinstance(created, session_pb2.CreateSessionResponse)
    session_id = created.session.meta.id

    # A live subscriber attached before the plan exists sees what the backlog shows.
    live: list[events_pb2.Event] = []
    ready = asyncio.Event()

    async def follow() -> None:
        stream = client.subscribe(session_id=session_id, after_sequence=0)
        ready.set()
        async for event in stream:
            live.append(event)
            if describe(event) == EXPECTED[-1]:
                return

    follower = asyncio.create_task(follow())
    await ready.wait()
    response = await client.call(
        "plan.use",
        action="act",
        project="proj",
        session_id=session_id,
        inputs={"name": "guide", "title": "T", "word": "new"},
    )
    assert isinstance(response, plan_pb2.UsePlanResponse)
    plan_id = response.plan.meta.id
    await run(client, plan_id)
    await client.call("plan.apply", plan_id=plan_id)
    await client.call("plan.rollback", plan_id=plan_id)
    await asyncio.wait_for(follower, 10)

    events = await plan_events(client, plan_id)
    assert [describe(e) for e in events] == EXPECTED
    assert [e.sequence for e in live] == [e.sequence for e in events]
    sequences = [e.sequence for e in events]
    assert sequences == sorted(set(sequences))
    assert {(e.plan_id, e.session_id, e.namespace) for e in events} == {(plan_id, session_id, "default")}
    completed = [e.tool_completed for e in events if e.type == "tool.completed"]
    assert all(c.ok and c.duration_ms >= 0 for c in completed)
    assert completed[0].result["path"] == "docs/guide.md"
    tree = await client.call("plan.tree", plan_id=plan_id)
    assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
    decisions = {e.plan_decision_made.node.id: e.sequence for e in events if e.type == "plan.decision_made"}
    assert {n.id: n.event_sequence for n in tree.nodes} == decisions
    applied = next(e.plan_apply_completed for e in events if e.type == "plan.apply_completed")
    assert sorted(applied.changed_paths) == ["docs/guide.md", "obsolete.txt", "src/app.py"]
    listed = await client.call("plan.list", session_id=session_id)
    assert isinstance(listed, plan_pb2.ListPlansResponse)
    assert [p.meta.id for p in listed.plans] == [plan_id]


async def test_use_in_a_session_starts_a_plan(client: ACPClient, tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "repo"
    write_tree(folder)
    before = snapshot(folder)
    await add_project(client, folder)
    await add_action(client, schema=SCHEMA)
    created = await client.call("session.create", project="proj")
    assert isinstance(created, session_pb2.CreateSessionResponse)
    session_id = created.session.meta.id
    told = await client.call(
        "session.tell", session_id=session_id, content="/use act name=notes word=fresh title='My notes'"
    )
    assert isinstance(told, session_pb2.TellSessionResponse)
    reply = told.replies[-1].content
    assert reply.startswith("Started plan ")
    plan_id = reply.split()[2]
    plan = await status(client, plan_id)
    assert (plan.session_id, plan.action, plan.project) == (session_id, "act", "proj")
    assert dict(plan.inputs) == {"name": "notes", "word": "fresh", "title": "My notes"}
    plan = await run(client, plan_id)
    assert plan.state == plan_pb2.PLAN_STATE_SUCCEEDED
    assert snapshot(folder) == before
    events = await plan_events(client, plan_id)
    assert {e.session_id for e in events} == {session_id}
    bad = await client.call("session.tell", session_id=session_id, content="/use act name=x")
    assert isinstance(bad, session_pb2.TellSessionResponse)
    assert "INVALID_PARAMS" in bad.replies[-1].content
