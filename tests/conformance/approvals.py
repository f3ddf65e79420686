"""Approvals (ACP 1.3) on every transport: a plan whose fs.write needs an answer waits, is
listed and shown, the first answer resumes it, a second is refused naming who decided, and
bad requests, unknown ids and other namespaces are refused."""

from __future__ import annotations

import asyncio
from typing import Any

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.contract import codec
from tests.conformance.harness import Run
from tests.conformance.scenarios import FORGED_TOKEN, MISSING_ID, plan_world, scenario, use

GATED = {"approval": {"ask": ["fs.write"]}}
ALLOW_ONCE = "APPROVAL_ANSWER_ALLOW_ONCE"


async def gated_world(run: Run, alice: ACPClient) -> None:
    """``act`` under a profile whose fs.write needs an answer, beside the conformance world."""
    await alice.call("automation_profile.add", name="gated", spec=GATED)
    await alice.call("action.add", name="gated", spec={**(await _act(alice)), "automation_profile": "gated"})


async def _act(alice: ACPClient) -> dict[str, Any]:
    shown = await alice.call("action.show", name="act")
    spec: dict[str, Any] = codec.to_dict(shown)["action"]["spec"]
    spec.pop("automation_profile", None)
    return spec


async def waiting_approval(alice: ACPClient, **fields: Any) -> str:
    """A plan of ``gated`` executed until its write waits: the id of its pending request."""
    plan_id = await use(alice, action="gated", **fields)
    await alice.call("plan.execute", plan_id=plan_id, wait=True)
    listed = await alice.call("approval.list", plan_id=plan_id)
    return str(listed.approvals[0].id)  # type: ignore[attr-defined]


async def settled(run: Run, plan_id: str) -> dict[str, Any]:
    """The plan once a resumed run ended (its answers then no longer move), polled out of
    the trace (how many polls it takes differs between transports)."""
    alice = ACPClient(run.backend.transport, token=run.backend.token("alice"))
    async with asyncio.timeout(10):
        while True:
            plan: dict[str, Any] = codec.to_dict(await alice.call("plan.status", plan_id=plan_id))["plan"]
            if plan["state"] not in ("PLAN_STATE_RUNNING", "PLAN_STATE_PENDING"):
                return plan
            await asyncio.sleep(0.02)


@scenario("approvals")
async def approvals_scenario(run: Run) -> None:
    alice, bob, reader = run.client(), run.client("bob"), run.client("reader")
    await plan_world(run)
    await gated_world(run, alice)
    approval_id = await waiting_approval(alice)
    shown = codec.to_dict(await alice.call("approval.show", approval_id=approval_id))["approval"]
    assert (shown["state"], shown["kind"], shown["tool"], shown["step_id"]) == (
        "APPROVAL_STATE_PENDING",
        "step",
        "fs.write",
        "create",
    ), shown
    plan_id = shown["plan_id"]
    status = codec.to_dict(await alice.call("plan.status", plan_id=plan_id))["plan"]
    assert status["state"] == "PLAN_STATE_AWAITING_APPROVAL", status
    listed = codec.to_dict(await alice.call("approval.list", state="APPROVAL_STATE_PENDING"))
    assert [a["id"] for a in listed["approvals"]] == [approval_id], listed
    await run.fails(alice.call("approval.list", page_token=FORGED_TOKEN), "INVALID_PARAMS")
    await run.fails(alice.call("approval.show"), "INVALID_PARAMS")
    await run.fails(alice.call("approval.show", approval_id=MISSING_ID), "NOT_FOUND", "APPROVAL_NOT_FOUND")
    await run.fails(bob.call("approval.show", approval_id=approval_id), "NOT_FOUND", "APPROVAL_NOT_FOUND")
    assert codec.to_dict(await bob.call("approval.list")) == {"approvals": [], "next_page_token": ""}
    await run.fails(alice.call("approval.answer", approval_id=approval_id), "INVALID_PARAMS")
    await run.fails(
        bob.call("approval.answer", approval_id=approval_id, answer=ALLOW_ONCE),
        "NOT_FOUND",
        "APPROVAL_NOT_FOUND",
    )
    await run.fails(
        reader.call("approval.answer", approval_id=approval_id, answer=ALLOW_ONCE),
        "AUTH_FORBIDDEN",
        "ROLE_FORBIDDEN",
    )
    answered = codec.to_dict(
        await alice.call("approval.answer", approval_id=approval_id, answer=ALLOW_ONCE, reason="fine")
    )["approval"]
    assert (answered["state"], answered["answer"], answered["reason"]) == (
        "APPROVAL_STATE_ALLOWED",
        ALLOW_ONCE,
        "fine",
    ), answered
    again = await run.fails(
        alice.call("approval.answer", approval_id=approval_id, answer="APPROVAL_ANSWER_REJECT_ONCE"),
        "INVALID_STATE",
        "APPROVAL_DECIDED",
    )
    assert again.details["answer"] == "allow_once", again
    done = await settled(run, plan_id)
    assert (done["phase"], done["state"]) == ("PLAN_PHASE_EXECUTE", "PLAN_STATE_SUCCEEDED"), done
    events = await run.events(alice, lambda e: e.type == "approval.decided", plan_id=plan_id)
    assert [e.type for e in events if e.type.startswith("approval.")] == [
        "approval.requested",
        "approval.decided",
    ]
