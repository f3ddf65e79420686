"""Family ``approvals``: how fast an answer resumes a plan waiting for an approval (ACP 1.3).

- ``approval_resume_ms``: in-process (the local client over a facade on a SQLite file), the
  p99 over rounds of the time from sending ``approval.answer`` (allow_once) to receiving the
  plan's next ``tool.invoked`` event on a subscription opened before it (the subscriber has
  read the plan's ``approval.requested`` first, so it is attached). Each round is a scripted
  plan of one ``fs.write`` step its profile asks about, executed until it waits.
- ``approval_resume_http_ms``: the same against ``agents serve`` (a subprocess): the answer
  over the envelope, the event over SSE.

The answer's one write decides the request, claims the plan's lease and marks it running;
the run then reads the plan and passes the gate before it publishes ``tool.invoked``.
"""

from __future__ import annotations

import asyncio
import pathlib
import statistics
import time

from bench.product import Product
from bench.run import Run
from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import approval_pb2, plan_pb2

ROUNDS = {"full": 200, "quick": 60, "smoke": 4}
STEP = {"id": "write", "tool": "fs.write", "args": {"path": "NOTES.md", "content": "hi\n"}}


def _folder(path: pathlib.Path) -> pathlib.Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "README.md").write_text("# Bench\n")
    return path


async def _world(client: ACPClient, folder: pathlib.Path) -> None:
    await client.call("resource.add", name="repo", spec={"type": "directory", "path": str(folder)})
    await client.call("project.add", name="proj", spec={"resources": ["repo"]})
    await client.call("automation_profile.add", name="gated", spec={"approval": {"ask": ["fs.write"]}})
    spec = {"actor": "scripted", "steps": [STEP], "automation_profile": "gated"}
    await client.call("action.add", name="act", spec=spec)


async def _round(client: ACPClient) -> float:
    """One plan paused at its write; milliseconds from the answer to its ``tool.invoked``."""
    used = await client.call("plan.use", action="act", project="proj")
    assert isinstance(used, plan_pb2.UsePlanResponse)
    plan_id = used.plan.meta.id
    executed = await client.call("plan.execute", plan_id=plan_id, wait=True)
    assert isinstance(executed, plan_pb2.ExecutePlanResponse)
    if executed.plan.state != plan_pb2.PLAN_STATE_AWAITING_APPROVAL:
        raise RuntimeError(f"bench plan did not wait for approval: {executed.plan}")
    stream = aiter(client.subscribe(plan_id=plan_id))
    try:
        requested = None
        while requested is None:
            event = await asyncio.wait_for(anext(stream), 10)
            if event.type == "approval.requested":
                requested = event.approval_requested.approval
        started = time.perf_counter()
        await client.call(
            "approval.answer", approval_id=requested.id, answer=approval_pb2.APPROVAL_ANSWER_ALLOW_ONCE
        )
        while True:
            event = await asyncio.wait_for(anext(stream), 10)
            if event.type == "tool.invoked":
                return (time.perf_counter() - started) * 1000
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def _rounds(client: ACPClient, count: int) -> list[float]:
    # The first round warms the paths up.
    times = [await _round(client) for _ in range(count + 1)]
    return times[1:]


def _p99(values: list[float]) -> float:
    if len(values) < 2:
        return max(values)
    return statistics.quantiles(values, n=100, method="inclusive")[98]


async def in_process(run: Run) -> None:
    folder = run.scratch("approvals-local")
    facade = open_facade(folder / "acp.db")
    client = ACPClient(LocalTransport(facade))
    try:
        await _world(client, _folder(folder / "project"))
        times = await _rounds(client, ROUNDS[run.mode.name])
    finally:
        await client.close()
        await facade.close()
    run.note("approval_resume_median_ms", statistics.median(times))
    run.record("approval_resume_ms", _p99(times), "in-process")


async def over_http(run: Run) -> None:
    folder = run.scratch("approvals-http")
    project = _folder(folder / "project")
    with Product(folder) as product:
        client = ACPClient(HTTPTransport.connect(product.http_url), token=product.token)
        try:
            await _world(client, project)
            times = await _rounds(client, ROUNDS[run.mode.name])
        finally:
            await client.close()
    run.note("approval_resume_http_median_ms", statistics.median(times))
    run.record("approval_resume_http_ms", _p99(times), "agents serve: envelope answer, SSE event")


def run_all(run: Run) -> None:
    asyncio.run(in_process(run))
    asyncio.run(over_http(run))
