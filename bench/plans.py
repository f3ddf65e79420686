"""The scripted plan the plan figures run: an action whose three steps write three files."""

from __future__ import annotations

import pathlib

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.v1 import plan_pb2

ACTION = "bench-write3"
PROJECT = "bench"
STEPS = [
    {"id": name, "tool": "fs.write", "args": {"path": f"out/{{{{name}}}}/{name}.txt", "content": text}}
    for name, text in (("a", "alpha {{name}}\n"), ("b", "beta {{name}}\n"), ("c", "gamma {{name}}\n"))
]


async def set_up(client: ACPClient, folder: pathlib.Path) -> None:
    """A directory project over ``folder`` (which exists) and the action, through the
    registry operations."""
    await client.call("resource.add", name=PROJECT, spec={"type": "directory", "path": str(folder)})
    await client.call("project.add", name=PROJECT, spec={"resources": [PROJECT]})
    await client.call(
        "action.add",
        name=ACTION,
        spec={"actor": "scripted", "prompt_template": "Write {{name}}.", "steps": STEPS},
    )


async def use(client: ACPClient, name: str) -> str:
    response = await client.call("plan.use", action=ACTION, project=PROJECT, inputs={"name": name})
    assert isinstance(response, plan_pb2.UsePlanResponse)
    return response.plan.meta.id


async def flow(client: ACPClient, name: str) -> None:
    """use, execute (waiting for it), apply: one complete plan."""
    plan_id = await use(client, name)
    executed = await client.call("plan.execute", plan_id=plan_id, wait=True)
    assert isinstance(executed, plan_pb2.ExecutePlanResponse)
    if executed.plan.state != plan_pb2.PLAN_STATE_SUCCEEDED:
        raise RuntimeError(f"plan {plan_id} ended {plan_pb2.PlanState.Name(executed.plan.state)}")
    applied = await client.call("plan.apply", plan_id=plan_id)
    assert isinstance(applied, plan_pb2.ApplyPlanResponse)
    if len(applied.changed_paths) != len(STEPS):
        raise RuntimeError(f"plan {plan_id} changed {list(applied.changed_paths)}")
