"""Plans whose actor is a model (provider ``openai``), against the fake OpenAI server: tool
calls as steps and decisions, streamed text, diff/apply/rollback, budgets, max_steps,
cancel, retries, keys, refused calls, corrections."""

from __future__ import annotations

import json
import logging
import pathlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import plan_pb2
from tests.facade.plans.helpers import ORIGINAL, plan_events, run, snapshot, status, use, wait_for
from tests.facade.plans.model_world import ACTOR, KEY, KEY_ENV, model_world
from tests.fake_openai import FakeOpenAI, Stream, chunk, error, eventually, turn

INPUTS = {"word": "old"}


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def model_client(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fake: FakeOpenAI
) -> AsyncIterator[ACPClient]:
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv("ACP_MODEL_BACKOFF_SECONDS", "0.01")
    facade = open_facade(tmp_path / "acp.db")
    client = ACPClient(LocalTransport(facade))
    yield client
    await client.close()
    await facade.close()


@pytest.fixture
def project(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "project"


async def tree(client: ACPClient, plan_id: str) -> plan_pb2.GetPlanTreeResponse:
    response = await client.call("plan.tree", plan_id=plan_id)
    assert isinstance(response, plan_pb2.GetPlanTreeResponse)
    return response


def edit_script(fake: FakeOpenAI) -> None:
    fake.then(
        turn("Let me read the app first.", [("fs_read", {"path": "src/app.py", "reason": "see the code"})]),
        turn(
            "",
            [
                ("fs_write", {"path": "docs/guide.md", "content": "# Guide\n", "reason": "document it"}),
                ("fs_replace", {"path": "src/app.py", "old": "'old'", "new": "'new'"}),
            ],
        ),
        turn("Removing the obsolete file.", [("fs_delete", {"path": "obsolete.txt"})]),
        turn("Done: documented, renamed and cleaned up.", tokens=(300, 10)),
    )


async def test_a_model_edits_files_through_tool_calls_then_diff_apply_rollback(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path
) -> None:
    client = model_client
    await model_world(client, project, fake.base_url)
    edit_script(fake)
    plan = await use(client, INPUTS)
    done = await run(client, plan.meta.id)
    assert (done.phase, done.state) == (plan_pb2.PLAN_PHASE_EXECUTE, plan_pb2.PLAN_STATE_SUCCEEDED), done
    # usage: three turns of (100 + 20) tokens and one of 310, at 1 per 1,000.
    assert done.cost.tokens == 3 * 120 + 310
    assert done.cost.spent == pytest.approx(0.67)
    assert (done.progress.done, done.progress.total) == (4, 4)

    shape = await tree(client, plan.meta.id)
    assert [(s.id, s.tool, s.state) for s in shape.steps] == [
        ("call-1", "fs.read", plan_pb2.PLAN_STATE_SUCCEEDED),
        ("call-2", "fs.write", plan_pb2.PLAN_STATE_SUCCEEDED),
        ("call-3", "fs.replace", plan_pb2.PLAN_STATE_SUCCEEDED),
        ("call-4", "fs.delete", plan_pb2.PLAN_STATE_SUCCEEDED),
    ]
    nodes = {n.id: n for n in shape.nodes}
    # A chain: root, one node per call, the final answer.
    assert [n.parent_id for n in shape.nodes] == ["", "d1", "d2", "d3", "d4", "d5"]
    assert nodes["d2"].rationale == "see the code"
    assert nodes["d2"].choice == "fs.read(path='src/app.py')"
    assert nodes["d2"].step_ids == ["call-1"]
    assert nodes["d4"].rationale == "The model gave no reason."
    assert {o.label for o in nodes["d3"].options} == {nodes["d3"].choice, nodes["d4"].choice}
    assert nodes["d5"].rationale == "Removing the obsolete file."
    assert nodes["d6"].choice.startswith("finish")
    assert nodes["d6"].rationale == "Done: documented, renamed and cleaned up."

    explain = await client.call("plan.explain", plan_id=plan.meta.id)
    assert isinstance(explain, plan_pb2.ExplainPlanResponse)
    assert "because: see the code" in explain.text
    assert "steps: call-1" in explain.text
    assert all(d.event_sequence for d in explain.decisions)

    events = await plan_events(client, plan.meta.id)
    types = [e.type for e in events]
    assert types.count("tool.invoked") == types.count("tool.completed") == 4
    deltas = [e for e in events if e.type == "plan.text_delta"]
    by_turn: dict[int, str] = {}
    for event in deltas:
        assert event.plan_text_delta.actor == ACTOR
        by_turn[event.plan_text_delta.turn] = (
            by_turn.get(event.plan_text_delta.turn, "") + event.plan_text_delta.text
        )
    assert by_turn == {
        1: "Let me read the app first.",
        3: "Removing the obsolete file.",
        4: "Done: documented, renamed and cleaned up.",
    }
    # Each turn's text comes before the decisions it led to.
    first_decision_of_turn_1 = next(
        e for e in events if e.type == "plan.decision_made" and e.plan_decision_made.node.id == "d2"
    )
    assert max(e.sequence for e in deltas if e.plan_text_delta.turn == 1) < first_decision_of_turn_1.sequence

    # What the model was given: the plan.prompt assembly, and the tools as functions.
    first = fake.requests[0].body
    system, user = first["messages"]
    assert system["role"] == "system"
    assert "You edit the files of a project." in system["content"]
    assert "Read before you write." in system["content"]
    assert "src/app.py" in system["content"]
    assert user == {"role": "user", "content": "Rename old everywhere."}
    offered = sorted(t["function"]["name"] for t in first["tools"])
    assert offered == ["fs_delete", "fs_list", "fs_read", "fs_replace", "fs_write"]
    prompt = await client.call("plan.prompt", plan_id=plan.meta.id)
    assert isinstance(prompt, plan_pb2.GetPlanPromptResponse)
    assert [(m.role, m.content) for m in prompt.messages] == [
        (m["role"], m["content"]) for m in first["messages"]
    ]
    assert sorted(prompt.tools) == ["fs.delete", "fs.list", "fs.read", "fs.replace", "fs.write"]
    # The result of fs.read went back to the model.
    second = fake.requests[1].body["messages"]
    assert second[2]["tool_calls"][0]["function"]["name"] == "fs_read"
    assert second[3]["role"] == "tool"
    assert "return 'old'" in json.loads(second[3]["content"])["content"]

    diff = await client.call("plan.diff", plan_id=plan.meta.id)
    assert isinstance(diff, plan_pb2.GetPlanDiffResponse)
    assert sorted((f.path, f.op) for f in diff.files) == [
        ("docs/guide.md", plan_pb2.ARTIFACT_OP_CREATE),
        ("obsolete.txt", plan_pb2.ARTIFACT_OP_DELETE),
        ("src/app.py", plan_pb2.ARTIFACT_OP_MODIFY),
    ]
    before = snapshot(project)
    await client.call("plan.apply", plan_id=plan.meta.id)
    assert (project / "src/app.py").read_text() == "def main():\n    return 'new'\n"
    assert (project / "docs/guide.md").read_text() == "# Guide\n"
    assert not (project / "obsolete.txt").exists()
    await client.call("plan.rollback", plan_id=plan.meta.id)
    assert snapshot(project) == before
    assert (project / "obsolete.txt").read_bytes() == ORIGINAL["obsolete.txt"]


async def test_a_failing_tool_goes_back_to_the_model(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path
) -> None:
    await model_world(model_client, project, fake.base_url)
    fake.then(turn("", [("fs_read", {"path": "missing.txt"})]), turn("That file does not exist."))
    plan = await use(model_client, INPUTS)
    done = await run(model_client, plan.meta.id)
    assert done.state == plan_pb2.PLAN_STATE_SUCCEEDED
    shape = await tree(model_client, plan.meta.id)
    assert shape.steps[0].state == plan_pb2.PLAN_STATE_FAILED
    answer = json.loads(fake.requests[1].body["messages"][-1]["content"])
    assert answer["error"]["code"] == "NOT_FOUND"


async def test_unknown_tools_and_bad_arguments_are_answered_as_tool_errors(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path
) -> None:
    await model_world(model_client, project, fake.base_url)
    fake.then(
        turn("", [("fs_raed", {"path": "README.md"})]),
        turn("", [("fs_read", '{"path": "README.md"')]),
        turn("", [("fs_read", {"path": "README.md"})]),
        turn("Read it."),
    )
    plan = await use(model_client, INPUTS)
    done = await run(model_client, plan.meta.id)
    assert done.state == plan_pb2.PLAN_STATE_SUCCEEDED
    unknown = json.loads(fake.requests[1].body["messages"][-1]["content"])
    assert "there is no tool 'fs_raed'" in unknown["error"]["message"]
    assert "fs.read" in unknown["error"]["message"]
    bad_json = json.loads(fake.requests[2].body["messages"][-1]["content"])
    assert "not valid JSON" in bad_json["error"]["message"]
    shape = await tree(model_client, plan.meta.id)
    assert [s.id for s in shape.steps] == ["call-1"]
    assert sum(n.rationale.startswith("Refused:") for n in shape.nodes) == 2


async def test_refused_calls_in_a_row_are_bounded(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path
) -> None:
    await model_world(model_client, project, fake.base_url)
    fake.repeat = turn("", [("rm_rf", {})])
    plan = await use(model_client, INPUTS)
    done = await run(model_client, plan.meta.id)
    assert done.state == plan_pb2.PLAN_STATE_FAILED
    assert done.last_error.code == "model_tool_errors"
    assert len(fake.requests) == 3


async def test_the_cost_budget_stops_the_model(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path
) -> None:
    await model_world(
        model_client, project, fake.base_url, profile={"cost_budget": 4.0}, cost_per_1k_tokens=1.0
    )
    fake.repeat = turn("Reading.", [("fs_read", {"path": "README.md"})], tokens=(2000, 500))
    plan = await use(model_client, INPUTS)
    done = await run(model_client, plan.meta.id)
    assert done.state == plan_pb2.PLAN_STATE_FAILED
    assert done.last_error.code == "BUDGET_EXCEEDED"
    # 2.5 per turn (the server's usage): the second crosses 4.0.
    assert len(fake.requests) == 2
    assert done.cost.spent == pytest.approx(5.0)
    assert done.cost.tokens == 5000
    assert "over the budget of 4" in done.last_error.message
    # The halting turn's text is all published (the model client may hold its last piece
    # back for the turn's next write), and before the halt.
    events = await plan_events(model_client, plan.meta.id)
    deltas = [e for e in events if e.type == "plan.text_delta" and e.plan_text_delta.turn == 2]
    assert "".join(e.plan_text_delta.text for e in deltas) == "Reading."
    assert [e.plan_text_delta.index for e in deltas] == list(range(len(deltas)))
    failed = next(e for e in events if e.type == "plan.error")
    assert max(e.sequence for e in deltas) < failed.sequence


async def test_a_turn_whose_prompt_alone_would_cross_the_budget_is_not_sent(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path
) -> None:
    await model_world(
        model_client, project, fake.base_url, profile={"cost_budget": 0.01}, cost_per_1k_tokens=1.0
    )
    plan = await use(model_client, INPUTS)
    done = await run(model_client, plan.meta.id)
    assert done.state == plan_pb2.PLAN_STATE_FAILED
    assert done.last_error.code == "BUDGET_EXCEEDED"
    assert "the next model turn needs about" in done.last_error.message
    assert fake.requests == []


async def test_a_long_answer_is_stopped_when_it_would_cross_the_budget(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path
) -> None:
    await model_world(
        model_client, project, fake.base_url, profile={"cost_budget": 0.5}, cost_per_1k_tokens=1.0
    )
    fake.then(Stream([chunk({"content": "blah " * 200}) for _ in range(50)] + [chunk({}, "stop")]))
    plan = await use(model_client, INPUTS)
    done = await run(model_client, plan.meta.id)
    assert done.state == plan_pb2.PLAN_STATE_FAILED
    assert done.last_error.code == "BUDGET_EXCEEDED"


async def test_max_steps_stops_the_model(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path
) -> None:
    await model_world(model_client, project, fake.base_url, profile={"max_steps": 2})
    fake.repeat = turn("", [("fs_read", {"path": "README.md"})])
    plan = await use(model_client, INPUTS)
    done = await run(model_client, plan.meta.id)
    assert done.state == plan_pb2.PLAN_STATE_FAILED
    assert done.last_error.code == "BUDGET_EXCEEDED"
    assert done.last_error.message == "step 'call-3' would be step 3; the automation profile allows 2"
    assert len(fake.requests) == 3


async def test_cancel_stops_a_streaming_model_within_a_second(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path
) -> None:
    await model_world(model_client, project, fake.base_url)
    fake.then(
        Stream([chunk({"content": f"thinking {i}. "}) for i in range(100)] + [chunk({}, "stop")], delay=0.2)
    )
    plan = await use(model_client, INPUTS)
    await model_client.call("plan.execute", plan_id=plan.meta.id)

    async def streaming() -> bool:
        return any(e.type == "plan.text_delta" for e in await plan_events(model_client, plan.meta.id))

    await eventually(lambda: fake.requests)
    started = time.monotonic()
    response = await model_client.call("plan.cancel", plan_id=plan.meta.id, reason="enough")
    assert time.monotonic() - started < 1
    assert isinstance(response, plan_pb2.CancelPlanResponse)
    assert response.plan.state == plan_pb2.PLAN_STATE_CANCELLED
    await eventually(lambda: fake.dropped)
    del streaming


async def test_a_rate_limit_is_retried_then_the_plan_goes_on(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path
) -> None:
    await model_world(model_client, project, fake.base_url)
    fake.then(error(429, "slow down", retry_after="0"), error(502, "bad gateway"), turn("All good."))
    plan = await use(model_client, INPUTS)
    done = await run(model_client, plan.meta.id)
    assert done.state == plan_pb2.PLAN_STATE_SUCCEEDED
    assert len(fake.requests) == 3


async def test_a_missing_key_fails_the_plan_naming_the_variable(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    await model_world(model_client, project, fake.base_url)
    monkeypatch.delenv(KEY_ENV)
    plan = await use(model_client, INPUTS)
    done = await run(model_client, plan.meta.id)
    assert done.state == plan_pb2.PLAN_STATE_FAILED
    assert done.last_error.code == "model_key_missing"
    assert KEY_ENV in done.last_error.message
    assert fake.requests == []


async def test_a_wrong_key_fails_the_plan_without_showing_it(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path
) -> None:
    await model_world(model_client, project, fake.base_url)
    fake.then(error(401, f"Incorrect API key provided: {KEY}", kind="invalid_request_error"))
    plan = await use(model_client, INPUTS)
    done = await run(model_client, plan.meta.id)
    assert done.last_error.code == "model_key_refused"
    assert KEY_ENV in done.last_error.message
    assert KEY not in done.last_error.message


async def test_a_correction_reruns_the_model_from_the_corrected_decision(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path
) -> None:
    client = model_client
    await model_world(client, project, fake.base_url)
    edit_script(fake)
    plan = await use(client, INPUTS)
    await run(client, plan.meta.id)
    # d3 is the fs.write of turn 2; its sibling fs.replace (d4) comes after it.
    corrected = await client.call(
        "plan.correct", plan_id=plan.meta.id, node_id="d3", text="write docs/README.md instead"
    )
    assert isinstance(corrected, plan_pb2.CorrectPlanResponse)
    assert (corrected.plan.phase, corrected.plan.state) == (
        plan_pb2.PLAN_PHASE_EXECUTE,
        plan_pb2.PLAN_STATE_PENDING,
    )
    assert corrected.node.correction == "write docs/README.md instead"
    assert corrected.node.parent_id == "d2"
    shape = await tree(client, plan.meta.id)
    superseded = {n.id for n in shape.nodes if n.superseded}
    assert superseded == {"d3", "d4", "d5", "d6"}
    assert [s.id for s in shape.steps if s.state == plan_pb2.PLAN_STATE_CANCELLED] == [
        "call-2",
        "call-3",
        "call-4",
    ]
    artifacts = await client.call("plan.artifacts", plan_id=plan.meta.id)
    assert isinstance(artifacts, plan_pb2.ListPlanArtifactsResponse)
    assert list(artifacts.artifacts) == []

    fake.then(
        turn("", [("fs_write", {"path": "docs/README.md", "content": "# Docs\n"})]),
        turn("Wrote docs/README.md as asked."),
    )
    done = await run(client, plan.meta.id)
    assert done.state == plan_pb2.PLAN_STATE_SUCCEEDED
    sent = fake.requests[4].body["messages"]
    # system, user, turn 1 (fs.read) and its result, then the correction: nothing of turn 2 on.
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "user"]
    assert sent[-1]["content"] == "Correction from the user: write docs/README.md instead"
    shape = await tree(client, plan.meta.id)
    live = [n for n in shape.nodes if not n.superseded]
    assert [n.id for n in live] == ["d1", "d2", "d7", "d8", "d9"]
    assert [n.parent_id for n in live] == ["", "d1", "d2", "d7", "d8"]
    artifacts = await client.call("plan.artifacts", plan_id=plan.meta.id)
    assert isinstance(artifacts, plan_pb2.ListPlanArtifactsResponse)
    assert [a.path for a in artifacts.artifacts] == ["docs/README.md"]


async def test_overrides_are_refused_on_model_plans(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path
) -> None:
    await model_world(model_client, project, fake.base_url)
    fake.then(turn("", [("fs_read", {"path": "README.md"})]), turn("ok"))
    plan = await use(model_client, INPUTS)
    await run(model_client, plan.meta.id)
    from cleveragents.acp.contract.errors import ACPError

    with pytest.raises(ACPError) as info:
        await model_client.call(
            "plan.correct",
            plan_id=plan.meta.id,
            node_id="d2",
            overrides=[{"step_id": "call-1", "remove": True}],
        )
    assert info.value.code == "INVALID_PARAMS"
    assert info.value.details["field"] == "overrides"


async def test_the_key_never_reaches_an_event_a_log_or_an_export(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = model_client
    await model_world(client, project, fake.base_url)
    edit_script(fake)
    fake.then(error(401, f"Incorrect API key provided: {KEY}"))
    session = await client.call("session.create", project="proj", orchestrator=ACTOR)
    session_id = session.session.meta.id  # type: ignore[attr-defined]
    plan = await use(client, INPUTS, session_id=session_id)
    await run(client, plan.meta.id)
    await client.call("plan.apply", plan_id=plan.meta.id)
    from cleveragents.acp.contract.errors import ACPError

    with pytest.raises(ACPError):
        await client.call("session.tell", session_id=session_id, content="hello")
    seen: list[Any] = []
    seen.extend(await plan_events(client, ""))
    for op, fields in [
        ("session.export", {"session_id": session_id}),
        ("plan.status", {"plan_id": plan.meta.id}),
        ("plan.prompt", {"plan_id": plan.meta.id}),
        ("plan.tree", {"plan_id": plan.meta.id}),
        ("plan.explain", {"plan_id": plan.meta.id}),
        ("actor.show", {"name": ACTOR}),
    ]:
        seen.append(await client.call(op, **fields))
    assert fake.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert len(seen) > 20
    for item in seen:
        assert KEY not in str(item)
    assert caplog.records
    for record in caplog.records:
        assert KEY not in record.getMessage()
        assert KEY not in str(record.args)


async def test_status_shows_the_plan_cost_while_it_runs(
    model_client: ACPClient, fake: FakeOpenAI, project: pathlib.Path
) -> None:
    await model_world(model_client, project, fake.base_url)
    fake.then(turn("", [("fs_read", {"path": "README.md"})]), turn("slow", delay=0.3, pieces=5))
    plan = await use(model_client, INPUTS)
    await model_client.call("plan.execute", plan_id=plan.meta.id)

    async def charged() -> bool:
        return (await status(model_client, plan.meta.id)).cost.tokens == 120

    from tests.facade.plans.helpers import eventually as eventually_async

    await eventually_async(charged)
    await wait_for(model_client, plan.meta.id, plan_pb2.PLAN_STATE_SUCCEEDED)
