"""Approvals (ACP 1.3) through the in-process client on a real SQLite store: a step or an apply
the profile's policy holds pauses the plan (awaiting_approval, no lease, no task); the first
answer wins and resumes it once; rejections, standing answers, deny rules, corrections,
expiry and the digest binding."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.call import Reply, Role
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.contract.transport import CallOptions
from cleveragents.acp.facade import auth
from cleveragents.acp.facade.domain.plans.approving import Approver
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.v1 import approval_pb2, plan_pb2
from tests.facade.plans.helpers import (
    PY,
    add_action,
    add_command_tool,
    add_profile,
    add_project,
    eventually,
    plan_events,
    run,
    status,
    use,
    wait_for,
    write_tree,
)
from tests.facade.plans.model_world import KEY, KEY_ENV, model_world
from tests.fake_openai import FakeOpenAI, turn

AWAITING = plan_pb2.PLAN_STATE_AWAITING_APPROVAL
SUCCEEDED = plan_pb2.PLAN_STATE_SUCCEEDED
FAILED = plan_pb2.PLAN_STATE_FAILED


@pytest.fixture
async def facade(tmp_path: pathlib.Path) -> AsyncIterator[ServiceFacade]:
    opened = open_facade(tmp_path / "acp.db")
    yield opened
    await opened.close()


@pytest.fixture
async def client(facade: ServiceFacade) -> AsyncIterator[ACPClient]:
    made = ACPClient(LocalTransport(facade))
    yield made
    await made.close()


async def world(client: ACPClient, folder: pathlib.Path, approval: dict[str, Any], **profile: Any) -> None:
    write_tree(folder)
    await add_project(client, folder)
    await add_profile(client, "gated", approval=approval, **profile)
    await add_action(client, profile="gated")


async def pending(client: ACPClient, plan_id: str) -> list[approval_pb2.Approval]:
    listed = await client.call("approval.list", plan_id=plan_id, state=approval_pb2.APPROVAL_STATE_PENDING)
    assert isinstance(listed, approval_pb2.ListApprovalsResponse)
    return list(listed.approvals)


async def answer(client: ACPClient, approval_id: str, how: str, **fields: Any) -> approval_pb2.Approval:
    answered = await client.call(
        "approval.answer",
        approval_id=approval_id,
        answer=approval_pb2.ApprovalAnswer.Value(f"APPROVAL_ANSWER_{how.upper()}"),
        **fields,
    )
    assert isinstance(answered, approval_pb2.AnswerApprovalResponse)
    return answered.approval


async def test_a_write_that_needs_approval_pauses_the_plan_and_the_first_answer_resumes_it_once(
    client: ACPClient, facade: ServiceFacade, tmp_path: pathlib.Path
) -> None:
    await world(client, tmp_path / "p", {"ask": ["fs.write"]})
    plan = await use(client)
    paused = await run(client, plan.meta.id)
    assert (paused.phase, paused.state) == (plan_pb2.PLAN_PHASE_EXECUTE, AWAITING)
    [asked] = await pending(client, plan.meta.id)
    assert (asked.kind, asked.step_id, asked.tool, asked.rule) == (
        "step",
        "create",
        "fs.write",
        "ask: fs.write",
    )
    assert asked.args["path"] == "docs/guide.md"
    assert asked.digest.startswith("sha256:")
    assert list(asked.answerable_by) == ["writer", "admin"]
    # No lease and no task while it waits.
    approver = approver_of(facade)
    assert approver.runner.task(plan.meta.id) is None
    assert plan.meta.id not in approver.gate.leases.held

    decided = await answer(client, asked.id, "allow_once", reason="looks right")
    assert (decided.state, decided.answered_by, decided.reason) == (
        approval_pb2.APPROVAL_STATE_ALLOWED,
        "local",
        "looks right",
    )
    done = await wait_for(client, plan.meta.id, SUCCEEDED)
    assert done.phase == plan_pb2.PLAN_PHASE_EXECUTE
    with pytest.raises(ACPError) as again:
        await answer(client, asked.id, "reject_once")
    assert again.value.code == "INVALID_STATE"
    assert again.value.details["refinement"] == "APPROVAL_DECIDED"
    assert again.value.details["answered_by"] == "local"

    events = await plan_events(client, plan.meta.id)
    types = [e.type for e in events]
    assert types.count("approval.requested") == types.count("approval.decided") == 1
    requested = next(e for e in events if e.type == "approval.requested")
    assert requested.approval_requested.approval.args["content"] == "# The guide\n"
    # The write ran once, after the answer.
    invoked = [e.tool_invoked.step_id for e in events if e.type == "tool.invoked"]
    assert invoked == ["create", "modify", "delete"]
    assert types.index("approval.decided") < types.index("tool.invoked")


def approver_of(facade: ServiceFacade) -> Approver:
    handler = facade._handlers["approval.answer"]
    approver = getattr(handler, "__self__").approver  # noqa: B009 (a bound method of the handler group)
    assert isinstance(approver, Approver)
    return approver


async def test_reject_once_fails_a_scripted_plan_and_allow_always_asks_once_per_tool(
    client: ACPClient, tmp_path: pathlib.Path
) -> None:
    await world(client, tmp_path / "p", {"ask": ["fs.*"]})
    first = await use(client)
    await run(client, first.meta.id)
    [asked] = await pending(client, first.meta.id)
    await answer(client, asked.id, "reject_once", reason="no")
    failed = await wait_for(client, first.meta.id, FAILED)
    assert failed.last_error.code == "approval_rejected"
    assert "rejected by local" in failed.last_error.message

    second = await use(client)
    await run(client, second.meta.id)
    [write] = await pending(client, second.meta.id)
    await answer(client, write.id, "allow_always")
    # fs.replace is another tool: asked again; allowed always too, then fs.delete asks.
    await wait_for(client, second.meta.id, AWAITING)
    [replace] = await pending(client, second.meta.id)
    assert replace.tool == "fs.replace"
    await answer(client, replace.id, "allow_once")
    await wait_for(client, second.meta.id, AWAITING)
    [delete] = await pending(client, second.meta.id)
    await answer(client, delete.id, "allow_once")
    await wait_for(client, second.meta.id, SUCCEEDED)


async def test_deny_wins_over_allow_and_refuses_without_asking(
    client: ACPClient, tmp_path: pathlib.Path
) -> None:
    await world(
        client, tmp_path / "p", {"ask": ["fs.*"], "allow": ["fs.delete", "fs.write"], "deny": ["fs.write"]}
    )
    plan = await use(client)
    done = await run(client, plan.meta.id)
    assert done.state == FAILED
    assert done.last_error.code == "approval_rejected"
    assert "deny: fs.write" in done.last_error.message
    assert await pending(client, plan.meta.id) == []


async def test_a_correction_voids_the_pending_request(client: ACPClient, tmp_path: pathlib.Path) -> None:
    await world(client, tmp_path / "p", {"ask": ["fs.write"]})
    plan = await use(client)
    await run(client, plan.meta.id)
    [asked] = await pending(client, plan.meta.id)
    tree = await client.call("plan.tree", plan_id=plan.meta.id)
    assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
    await client.call(
        "plan.correct", plan_id=plan.meta.id, node_id=tree.nodes[-1].id, text="use another title"
    )
    shown = await client.call("approval.show", approval_id=asked.id)
    assert isinstance(shown, approval_pb2.GetApprovalResponse)
    assert shown.approval.state == approval_pb2.APPROVAL_STATE_VOID
    with pytest.raises(ACPError) as void:
        await answer(client, asked.id, "allow_once")
    assert void.value.details["refinement"] == "APPROVAL_VOID"
    after = await status(client, plan.meta.id)
    assert after.state == plan_pb2.PLAN_STATE_PENDING


async def test_expiry_applies_the_fallback_once_with_an_event(
    client: ACPClient, tmp_path: pathlib.Path
) -> None:
    await world(client, tmp_path / "p", {"ask": ["fs.write"], "expire_seconds": 1})
    plan = await use(client)
    await run(client, plan.meta.id)
    [asked] = await pending(client, plan.meta.id)
    assert asked.fallback == "reject"
    assert asked.HasField("expire_time")
    await asyncio.sleep(1.1)
    shown = await client.call("approval.show", approval_id=asked.id)
    assert isinstance(shown, approval_pb2.GetApprovalResponse)
    assert (shown.approval.state, shown.approval.answered_by) == (
        approval_pb2.APPROVAL_STATE_EXPIRED,
        "expiry",
    )
    failed = await wait_for(client, plan.meta.id, FAILED)
    assert failed.last_error.code == "approval_rejected"
    with pytest.raises(ACPError) as late:
        await answer(client, asked.id, "allow_once")
    assert late.value.details["refinement"] == "APPROVAL_DECIDED"
    types = [e.type for e in await plan_events(client, plan.meta.id)]
    assert types.count("approval.expired") == 1


async def test_eight_concurrent_answers_store_one_decision_and_resume_once(
    client: ACPClient, tmp_path: pathlib.Path
) -> None:
    await world(client, tmp_path / "p", {"ask": ["fs.write"]})
    plan = await use(client)
    await run(client, plan.meta.id)
    [asked] = await pending(client, plan.meta.id)
    outcomes = await asyncio.gather(
        *(answer(client, asked.id, "allow_once") for _ in range(8)), return_exceptions=True
    )
    wins = [o for o in outcomes if isinstance(o, approval_pb2.Approval)]
    losses = [o for o in outcomes if isinstance(o, ACPError)]
    assert len(wins) == 1
    assert len(losses) == 7
    assert {e.details["refinement"] for e in losses} == {"APPROVAL_DECIDED"}
    await wait_for(client, plan.meta.id, SUCCEEDED)
    events = await plan_events(client, plan.meta.id)
    assert [e.tool_invoked.step_id for e in events if e.type == "tool.invoked"] == [
        "create",
        "modify",
        "delete",
    ]
    assert sum(1 for e in events if e.type == "approval.decided") == 1


async def test_an_apply_that_needs_approval_pauses_before_it_writes(
    client: ACPClient, tmp_path: pathlib.Path
) -> None:
    folder = tmp_path / "p"
    await world(client, folder, {"ask": ["apply"]}, auto_apply=True)
    plan = await use(client)
    await run(client, plan.meta.id)
    paused = await wait_for(client, plan.meta.id, AWAITING)
    assert not (folder / "docs/guide.md").exists()
    [asked] = await pending(client, plan.meta.id)
    diff = await client.call("plan.diff", plan_id=plan.meta.id)
    assert isinstance(diff, plan_pb2.GetPlanDiffResponse)
    assert asked.kind == "apply"
    assert asked.digest == diff.digest
    assert "+# The guide" in asked.diff
    assert paused.phase == plan_pb2.PLAN_PHASE_EXECUTE
    await answer(client, asked.id, "allow_once", digest=diff.digest)

    async def applied() -> bool:
        plan_now = await status(client, plan.meta.id)
        return (plan_now.phase, plan_now.state) == (plan_pb2.PLAN_PHASE_APPLY, SUCCEEDED)

    await eventually(applied)
    assert (folder / "docs/guide.md").read_text() == "# The guide\n"


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


async def test_a_model_plans_write_pauses_and_resumes_with_the_model_told_the_result(
    client: ACPClient, fake: FakeOpenAI, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    await model_world(client, tmp_path / "p", fake.base_url, profile={"approval": {"ask": ["fs.write"]}})
    fake.then(
        turn("", [("fs_read", {"path": "README.md"}), ("fs_write", {"path": "NOTES.md", "content": "hi\n"})]),
        turn("Done.", tokens=(10, 2)),
    )
    plan = await use(client, {"word": "old"})
    paused = await run(client, plan.meta.id)
    assert paused.state == AWAITING
    [asked] = await pending(client, plan.meta.id)
    assert (asked.tool, asked.args["path"]) == ("fs.write", "NOTES.md")
    assert len(fake.requests) == 1
    await answer(client, asked.id, "allow_once")
    done = await wait_for(client, plan.meta.id, SUCCEEDED)
    assert done.progress.done == 2
    # The model was asked once more, with both results.
    assert len(fake.requests) == 2
    tool_messages = [m for m in fake.bodies()[1]["messages"] if m["role"] == "tool"]
    assert len(tool_messages) == 2
    assert "not run" not in tool_messages[1]["content"]
    events = await plan_events(client, plan.meta.id)
    assert [e.tool_invoked.tool for e in events if e.type == "tool.invoked"] == ["fs.read", "fs.write"]


async def test_a_policy_that_cannot_be_used_is_refused_when_stored(client: ACPClient) -> None:
    for approval, field in (
        ({"ask": ["command:("]}, "spec.approval.ask[0]"),
        ({"fallback": "maybe"}, "spec.approval.fallback"),
        ({"approver_role": "reader"}, "spec.approval.approver_role"),
    ):
        with pytest.raises(ACPError) as refused:
            await add_profile(client, "bad", approval=approval)
        assert (refused.value.code, refused.value.details["field"]) == ("INVALID_PARAMS", field)


async def test_command_lines_cost_and_reject_always_scope(client: ACPClient, tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "p"
    write_tree(folder)
    await add_project(client, folder)
    await add_command_tool(client, "say", [PY, "-c", "print('{{word}}')", "{{word}}"])
    await add_command_tool(client, "pricey", [PY, "-c", "pass"], cost=5.0)
    approval = {"ask": ["command:hello$"], "deny": ["command:--force"], "cost_threshold": 5}
    await add_profile(client, "cmds", allowed_tools=["say", "pricey"], approval=approval)
    steps = [
        {"id": "quiet", "tool": "say", "args": {"word": "quiet"}},
        {"id": "hello", "tool": "say", "args": {"word": "hello"}},
        {"id": "costly", "tool": "pricey", "args": {}},
        {"id": "again", "tool": "say", "args": {"word": "hello"}},
        {"id": "forced", "tool": "say", "args": {"word": "--force"}},
    ]
    await add_action(client, steps=steps, profile="cmds")
    plan = await use(client)
    await run(client, plan.meta.id)
    # "quiet" ran without asking; "hello"'s command line matches the pattern.
    [hello] = await pending(client, plan.meta.id)
    assert hello.step_id == "hello"
    assert hello.rule == "ask: command:hello$"
    assert list(hello.command)[-1] == "hello"
    await answer(client, hello.id, "allow_always")
    [costly] = [a for a in await pending_soon(client, plan.meta.id)]
    assert (costly.step_id, costly.rule) == ("costly", "cost_threshold: 5 >= 5")
    await answer(client, costly.id, "allow_once")
    # "again" matches the pattern allowed always: no question; "forced" is denied.
    failed = await wait_for(client, plan.meta.id, FAILED)
    assert failed.last_error.code == "approval_rejected"
    assert "deny: command:--force" in failed.last_error.message
    events = await plan_events(client, plan.meta.id)
    assert [e.tool_invoked.step_id for e in events if e.type == "tool.invoked"] == [
        "quiet",
        "hello",
        "costly",
        "again",
    ]


async def pending_soon(client: ACPClient, plan_id: str) -> list[approval_pb2.Approval]:
    await wait_for(client, plan_id, AWAITING)
    return await pending(client, plan_id)


async def test_who_may_answer_an_admin_only_request_and_another_namespace(tmp_path: pathlib.Path) -> None:
    tokens = tmp_path / "tokens.toml"
    made = {
        "admin": auth.create_token(tokens, "boss", ["default"], role=Role.ADMIN),
        "writer": auth.create_token(tokens, "dev", ["default"], role=Role.WRITER),
        "reader": auth.create_token(tokens, "viewer", ["default"], role=Role.READER),
        "other": auth.create_token(tokens, "stranger", ["elsewhere"], role=Role.ADMIN),
    }
    facade = open_facade(tmp_path / "acp.db", authenticator=auth.TokenAuthenticator(tokens))
    clients = {who: ACPClient(LocalTransport(facade), token=token) for who, token in made.items()}
    try:
        boss = clients["admin"]
        await world(boss, tmp_path / "p", {"ask": ["fs.write"], "approver_role": "admin"})
        plan = await use(boss)
        await run(boss, plan.meta.id)
        [asked] = await pending(boss, plan.meta.id)
        assert list(asked.answerable_by) == ["admin"]
        for who, code in (("writer", "AUTH_FORBIDDEN"), ("reader", "AUTH_FORBIDDEN"), ("other", "NOT_FOUND")):
            with pytest.raises(ACPError) as refused:
                await answer(clients[who], asked.id, "allow_once")
            assert refused.value.code == code, who
        # The reader and the writer see it; another namespace does not.
        assert [a.id for a in await pending(clients["reader"], plan.meta.id)] == [asked.id]
        listed = await clients["other"].call("approval.list")
        assert isinstance(listed, approval_pb2.ListApprovalsResponse)
        assert list(listed.approvals) == []
        decided = await answer(boss, asked.id, "allow_once")
        assert decided.answered_by == "boss"
        await wait_for(boss, plan.meta.id, SUCCEEDED)
    finally:
        for made_client in clients.values():
            await made_client.close()
        await facade.close()


async def test_cancelling_a_waiting_plan_voids_its_request(client: ACPClient, tmp_path: pathlib.Path) -> None:
    await world(client, tmp_path / "p", {"ask": ["fs.write"]})
    plan = await use(client)
    await run(client, plan.meta.id)
    [asked] = await pending(client, plan.meta.id)
    cancelled = await client.call("plan.cancel", plan_id=plan.meta.id, reason="not today")
    assert isinstance(cancelled, plan_pb2.CancelPlanResponse)
    assert cancelled.plan.state == plan_pb2.PLAN_STATE_CANCELLED
    with pytest.raises(ACPError) as void:
        await answer(client, asked.id, "allow_once")
    assert void.value.details["refinement"] == "APPROVAL_VOID"
    assert void.value.details["replaced_by"] == ""
    assert (await status(client, plan.meta.id)).state == plan_pb2.PLAN_STATE_CANCELLED


async def test_an_apply_whose_diff_changed_since_it_asked_is_asked_again(
    client: ACPClient, tmp_path: pathlib.Path
) -> None:
    folder = tmp_path / "p"
    await world(client, folder, {"ask": ["apply"]})
    plan = await use(client)
    await run(client, plan.meta.id)
    applied = await client.call("plan.apply", plan_id=plan.meta.id)
    assert isinstance(applied, plan_pb2.ApplyPlanResponse)
    assert applied.plan.state == AWAITING
    assert list(applied.changed_paths) == []
    [asked] = await pending(client, plan.meta.id)
    # The project now holds what one artifact would write: that artifact is gone from the diff.
    (folder / "docs").mkdir()
    (folder / "docs/guide.md").write_text("# The guide\n")
    with pytest.raises(ACPError) as void:
        await answer(client, asked.id, "allow_once")
    assert void.value.details["refinement"] == "APPROVAL_VOID"
    [again] = await pending(client, plan.meta.id)
    assert void.value.details["replaced_by"] == again.id
    assert again.digest != asked.digest
    assert "docs/guide.md" not in again.diff
    await answer(client, again.id, "allow_once")

    async def applied_now() -> bool:
        now = await status(client, plan.meta.id)
        return (now.phase, now.state) == (plan_pb2.PLAN_PHASE_APPLY, SUCCEEDED)

    await eventually(applied_now)
    assert not (folder / "obsolete.txt").exists()


async def test_the_sessions_automation_profile_brings_its_policy(
    client: ACPClient, tmp_path: pathlib.Path
) -> None:
    folder = tmp_path / "p"
    write_tree(folder)
    await add_project(client, folder)
    await add_profile(client, "gated", approval={"ask": ["fs.write"]})
    await add_action(client)
    created = await client.call("session.create", project="proj")
    session_id = created.session.meta.id  # type: ignore[attr-defined]
    await client.call(
        "session.update",
        session_id=session_id,
        session={"automation_profile": "gated"},
        update_mask="automationProfile",
    )
    plan = await use(client, session_id=session_id)
    paused = await run(client, plan.meta.id)
    assert paused.state == AWAITING
    listed = await client.call("approval.list", session_id=session_id)
    assert isinstance(listed, approval_pb2.ListApprovalsResponse)
    [asked] = listed.approvals
    assert (asked.session_id, asked.plan_id) == (session_id, plan.meta.id)


async def test_a_retried_answer_is_replayed_not_refused(
    client: ACPClient, facade: ServiceFacade, tmp_path: pathlib.Path
) -> None:
    """The same request id again (a client that lost the first answer): the first answer,
    replayed, not APPROVAL_DECIDED; the plan resumed once."""
    await world(client, tmp_path / "p", {"ask": ["fs.write"]})
    plan = await use(client)
    await run(client, plan.meta.id)
    [asked] = await pending(client, plan.meta.id)
    op = catalog.OPERATIONS["approval.answer"]
    request = approval_pb2.AnswerApprovalRequest(
        approval_id=asked.id, answer=approval_pb2.APPROVAL_ANSWER_ALLOW_ONCE
    )
    answers = []
    for _ in range(2):
        reply = Reply()
        options = CallOptions(acp_version=None, token=None, request_id="answer-1", reply=reply)
        answers.append((await LocalTransport(facade).call(op, request, options), reply.replayed))
    (first, first_replayed), (second, second_replayed) = answers
    assert (first_replayed, second_replayed) == (False, True)
    assert first == second
    await wait_for(client, plan.meta.id, SUCCEEDED)
    events = await plan_events(client, plan.meta.id)
    assert sum(1 for e in events if e.type == "approval.decided") == 1
