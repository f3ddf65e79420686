"""Noisy neighbours: one namespace's reads while another namespace works the server hard.

- ``noisy_neighbour_p99_ms``: p99 latency of ``session.show`` in namespace ``default``
  (one call every few milliseconds, over gRPC) while namespace ``noisy`` runs a 1,000-step
  plan and, over and over, the caller-shaped work that once held the event loop: ``plan.use``
  against an ``inputs_schema`` pattern ``^(a+)+$`` with a 60-character input, and
  ``context.simulate`` with a glob of ten ``**/`` segments over a 30-deep folder.
- Beside it (details): the same p99 with the server idle (``quiet_neighbour_p99_ms``), how
  long the plan took, whether it finished within the bound, and how many pathological calls ran.

The noisy work runs on a thread of its own with its own event loop and connection, so the
probe's loop measures the server, not the noisy client. Everything is bounded: the plan is
cancelled if it has not finished within the mode's bound, each call has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import threading
import time
from collections.abc import Callable
from typing import Any

from bench.load import percentile
from bench.product import Product
from bench.run import Run
from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade import auth
from cleveragents.acp.v1 import plan_pb2, session_pb2

NOISY = "noisy"
PROJECT = "noisy"
# Plan steps, and the bound on the noisy phase (seconds), per mode.
STEPS = {"full": 1000, "quick": 1000, "smoke": 20}
NOISY_SECONDS = {"full": 300.0, "quick": 120.0, "smoke": 20.0}
QUIET_SECONDS = {"full": 5.0, "quick": 2.0, "smoke": 0.5}
PROBE_INTERVAL = 0.005
CALL_TIMEOUT = 60.0
DEPTH = 30
REDOS_SCHEMA = {"type": "object", "properties": {"word": {"type": "string", "pattern": "^(a+)+$"}}}
REDOS_INPUT = {"word": "a" * 60 + "!"}
DEEP_GLOB = "**/" * 10 + "x*y*z*w"
FINISHED = {plan_pb2.PLAN_STATE_SUCCEEDED, plan_pb2.PLAN_STATE_FAILED, plan_pb2.PLAN_STATE_CANCELLED}


def _client(product: Product, token: str, timeout: float = CALL_TIMEOUT) -> ACPClient:
    return ACPClient(GrpcTransport.connect(product.grpc_target, timeout=timeout), token=token)


async def _set_up(client: ACPClient, folder: pathlib.Path, steps: int) -> None:
    """The noisy namespace's project over a deep folder, its long plan's action, the ReDoS
    action and the deep glob's context configuration."""
    folder.joinpath(*["d"] * DEPTH).mkdir(parents=True, exist_ok=True)
    folder.joinpath(*["d"] * DEPTH, "xyz.txt").write_text("deep\n")
    await client.call(
        "resource.add", namespace=NOISY, name=PROJECT, spec={"type": "directory", "path": str(folder)}
    )
    await client.call("project.add", namespace=NOISY, name=PROJECT, spec={"resources": [PROJECT]})
    long_steps = [
        {"tool": "fs.write", "args": {"path": f"out/{i}.txt", "content": f"{i}\n"}} for i in range(steps)
    ]
    await client.call(
        "action.add", namespace=NOISY, name="long", spec={"actor": "scripted", "steps": long_steps}
    )
    await client.call(
        "action.add", namespace=NOISY, name="redos", spec={"actor": "scripted", "inputs_schema": REDOS_SCHEMA}
    )
    config = {"sources": [{"resource": PROJECT, "globs": [DEEP_GLOB]}]}
    await client.call("context.set", namespace=NOISY, project=PROJECT, config=config)


async def _noisy(client: ACPClient, seconds: float) -> dict[str, Any]:
    """Run the long plan and the pathological calls until the plan ends or ``seconds`` pass."""
    used = await client.call("plan.use", namespace=NOISY, action="long", project=PROJECT)
    assert isinstance(used, plan_pb2.UsePlanResponse)
    plan_id = used.plan.meta.id
    began = time.monotonic()
    await client.call("plan.execute", plan_id=plan_id)
    calls = 0
    state = used.plan.state
    while time.monotonic() - began < seconds:
        try:
            await client.call(
                "plan.use", namespace=NOISY, action="redos", project=PROJECT, inputs=REDOS_INPUT
            )
        except ACPError as exc:
            if exc.code != "INVALID_PARAMS":
                raise
        await client.call("context.simulate", namespace=NOISY, project=PROJECT, prompt="p")
        calls += 2
        status = await client.call("plan.status", plan_id=plan_id)
        assert isinstance(status, plan_pb2.GetPlanStatusResponse)
        state = status.plan.state
        if state in FINISHED:
            break
    plan_seconds = time.monotonic() - began
    finished = state in FINISHED
    if not finished:
        with contextlib.suppress(ACPError):  # it may end meanwhile
            await client.call("plan.cancel", plan_id=plan_id, reason="benchmark bound")
    return {
        "plan_seconds": plan_seconds,
        "finished": finished,
        "state": plan_pb2.PlanState.Name(state),
        "pathological_calls": calls,
    }


def _in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run the coroutine factory ``work`` on a thread with its own event loop."""
    outcome: dict[str, Any] = {}

    def main() -> None:
        try:
            outcome["result"] = asyncio.run(work())
        except BaseException as exc:  # handed back to the caller
            outcome["error"] = exc

    thread = threading.Thread(target=main, name="noisy-neighbour", daemon=True)
    thread.start()
    return thread, outcome


async def _probe(
    client: ACPClient, session_id: str, until: Callable[[], bool], seconds: float
) -> tuple[list[float], int]:
    """Latencies (ms) of ``session.show`` one after another until ``until()`` or ``seconds``,
    and how many failed. A failed call (its deadline passed while the server was held)
    counts with the time it took: the stall is what this measures."""
    latencies: list[float] = []
    failed = 0
    deadline = time.monotonic() + seconds
    while not until() and time.monotonic() < deadline:
        began = time.perf_counter()
        try:
            await client.call("session.show", session_id=session_id)
        except ACPError:
            failed += 1
        latencies.append((time.perf_counter() - began) * 1000)
        await asyncio.sleep(PROBE_INTERVAL)
    return latencies, failed


async def _measure(run: Run, product: Product, noisy_token: str, folder: pathlib.Path) -> None:
    mode = run.mode.name
    # A call may wait as long as the server is held: today a long plan holds it throughout.
    patience = NOISY_SECONDS[mode] + CALL_TIMEOUT
    probe = _client(product, product.token, patience)
    try:
        created = await probe.call("session.create", title="neighbour")
        assert isinstance(created, session_pb2.CreateSessionResponse)
        session_id = created.session.meta.id
        setup = _client(product, noisy_token)
        try:
            await _set_up(setup, folder, STEPS[mode])
        finally:
            await setup.close()
        quiet, _ = await _probe(probe, session_id, lambda: False, QUIET_SECONDS[mode])

        async def noisy() -> dict[str, Any]:
            client = _client(product, noisy_token, patience)
            try:
                return await _noisy(client, NOISY_SECONDS[mode])
            finally:
                await client.close()

        thread, outcome = _in_thread(noisy)
        loud, failed = await _probe(probe, session_id, lambda: not thread.is_alive(), patience)
        thread.join(patience)
    finally:
        await probe.close()
    if "error" in outcome:
        raise RuntimeError(f"the noisy namespace's work failed: {outcome['error']!r}") from outcome["error"]
    if "result" not in outcome:
        raise RuntimeError(f"the noisy namespace's work did not end within {patience:g} s")
    run.record("noisy_neighbour_p99_ms", percentile(loud, 99), by="python-grpc")
    run.note("quiet_neighbour_p99_ms", percentile(quiet, 99))
    run.note("noisy_neighbour_max_ms", max(loud))
    run.note("noisy_neighbour_probes", len(loud))
    run.note("noisy_neighbour_failed_probes", failed)
    run.note("noisy_neighbour_plan_steps", STEPS[mode])
    for key, value in outcome["result"].items():
        run.note(f"noisy_neighbour_{key}", value)


def run_all(run: Run) -> None:
    folder = run.scratch("neighbours")
    # The noisy namespace's principal, in the token file the product then adds its own to.
    noisy_token = auth.create_token(folder / "tokens.toml", NOISY, [NOISY])
    with Product(folder) as product:
        asyncio.run(_measure(run, product, noisy_token, folder / "repo"))
