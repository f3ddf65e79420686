"""Every state-changing plan operation, in every reachable state where it is invalid,
answers INVALID_STATE and changes nothing."""

from __future__ import annotations

import pathlib

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import plan_pb2
from tests.facade.plans.helpers import (
    PY,
    add_action,
    add_command_tool,
    add_profile,
    add_project,
    eventually,
    run,
    status,
    use,
    write_tree,
)

S, E, A = "strategize", "execute", "apply"
# Where each operation is valid: the contract this test holds the engine to.
VALID: dict[str, set[tuple[str, str]]] = {
    "plan.execute": {(S, "pending"), (E, "pending")},
    "plan.apply": {(E, "succeeded"), (A, "failed")},
    "plan.cancel": {(S, "pending"), (S, "running"), (E, "pending"), (E, "running")},
    # Before apply and not while running; a plan without a tree has nothing to correct.
    "plan.correct": {(S, "succeeded"), (S, "failed"), (E, "pending"), (E, "succeeded"), (E, "failed")},
    "plan.rollback": {(A, "succeeded")},
}


def where(plan: plan_pb2.Plan) -> tuple[str, str]:
    phase = plan_pb2.PlanPhase.Name(plan.phase).removeprefix("PLAN_PHASE_").lower()
    state = plan_pb2.PlanState.Name(plan.state).removeprefix("PLAN_STATE_").lower()
    return phase, state


async def reach_every_state(client: ACPClient, tmp_path: pathlib.Path) -> dict[tuple[str, str], str]:
    folder = tmp_path / "repo"
    write_tree(folder)
    await add_project(client, folder)
    await add_command_tool(client, "slow", [PY, "-c", "import time; time.sleep(30)"])
    await add_profile(client, "slow", allowed_tools=["slow"])
    await client.call("actor.add", name="pricey", spec={"provider": "scripted", "cost_per_1k_tokens": 1000})
    await add_profile(client, "broke", cost_budget=0.001)
    await add_action(client)
    await add_action(client, name="slow", steps=[{"tool": "slow", "args": {}}], profile="slow")
    await add_action(client, name="failing", steps=[{"tool": "fs.delete", "args": {"path": "missing"}}])
    await add_action(client, name="broke", steps=[], actor="pricey", profile="broke")

    plans: dict[tuple[str, str], str] = {}

    async def keep(plan_id: str) -> None:
        plans[where(await status(client, plan_id))] = plan_id

    await keep((await use(client)).meta.id)
    cancelled = (await use(client)).meta.id
    await client.call("plan.cancel", plan_id=cancelled)
    await keep(cancelled)
    await keep((await run(client, (await use(client, {}, action="broke")).meta.id)).meta.id)
    succeeded = (await run(client, (await use(client)).meta.id)).meta.id
    await keep(succeeded)
    await keep((await run(client, (await use(client, {}, action="failing")).meta.id)).meta.id)
    corrected = (await run(client, (await use(client)).meta.id)).meta.id
    await client.call("plan.correct", plan_id=corrected, node_id="d2", text="again")
    await keep(corrected)
    applied = (await run(client, (await use(client)).meta.id)).meta.id
    rolled_back = (await run(client, (await use(client)).meta.id)).meta.id
    await client.call("plan.apply", plan_id=rolled_back)
    await client.call("plan.rollback", plan_id=rolled_back)
    await keep(rolled_back)
    await client.call("plan.apply", plan_id=applied)
    await keep(applied)
    running = (await use(client, {}, action="slow")).meta.id
    await client.call("plan.execute", plan_id=running)

    async def executing() -> bool:
        return where(await status(client, running)) == (E, "running")

    await eventually(executing)
    await keep(running)
    return plans


async def test_invalid_operations_answer_invalid_state(client: ACPClient, tmp_path: pathlib.Path) -> None:
    plans = await reach_every_state(client, tmp_path)
    assert set(plans) == {
        (S, "pending"),
        (S, "cancelled"),
        (S, "failed"),
        (E, "succeeded"),
        (E, "failed"),
        (E, "pending"),
        (E, "running"),
        (A, "succeeded"),
        (A, "rolled_back"),
    }
    refused = 0
    for state, plan_id in sorted(plans.items()):
        before = await status(client, plan_id)
        for operation, valid in VALID.items():
            if state in valid:
                continue
            params: dict[str, str] = {"plan_id": plan_id}
            if operation == "plan.correct":
                params["node_id"] = "d1"
            with pytest.raises(ACPError) as info:
                await client.call(operation, params)
            assert info.value.code == "INVALID_STATE", (operation, state, info.value)
            refused += 1
        after = await status(client, plan_id)
        assert where(after) == where(before), f"a refused call changed {state}"
    assert refused >= 25
    # Correcting a plan that has no decision tree yet is refused too.
    with pytest.raises(ACPError) as info:
        await client.call("plan.correct", plan_id=plans[(S, "pending")], node_id="d1")
    assert info.value.code == "INVALID_STATE"
    # The actor was given nothing before strategizing: no prompt to show.
    for state in ((S, "pending"), (S, "cancelled")):
        with pytest.raises(ACPError) as info:
            await client.call("plan.prompt", plan_id=plans[state])
        assert info.value.code == "INVALID_STATE"
    # Read views answer in every state.
    for plan_id in plans.values():
        for operation in ("plan.status", "plan.tree", "plan.explain", "plan.diff", "plan.artifacts"):
            await client.call(operation, plan_id=plan_id)
    await client.call("plan.cancel", plan_id=plans[(E, "running")])
