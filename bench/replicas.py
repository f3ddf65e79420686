"""Replicas of ``agents serve`` over one PostgreSQL schema (only where PostgreSQL is reachable,
as bench/postgres.py; otherwise the family says so and records nothing).

- ``replica_event_latency_p99_ms``: an event committed through replica A (``session.tell``
  over A's envelope) -> its SSE frame read by a subscriber of replica B; from the event's
  own time (stamped by A just before its commit; one host, one clock) to the frame's arrival.
- ``takeover_s``: replica A runs a plan whose step waits; A is frozen (SIGSTOP, so its
  process still exists and only the lease's expiry, measured on the database's clock, tells
  the others it stopped: what a replica on another host looks like) -> replica B has
  recorded the plan's outcome (failed ``interrupted``). The lease is ``TAKEOVER_LEASE_S``;
  the goal is the lease + 2 s. The same with A SIGKILLed instead, which a replica of the
  same host sees at once through /proc, is in the details (``takeover_killed_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import pathlib
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson

from bench.postgres import URL, reachable, schema
from bench.product import Product
from bench.run import Run
from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.v1 import plan_pb2

TAKEOVER_LEASE_S = 3.0
# The plan's step: writes its pid, then waits for a file (never created: the replica dies).
WAITING = (
    "import os, sys, time\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "deadline = time.monotonic() + 120\n"
    "while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:\n"
    "    time.sleep(0.02)\n"
)
# Under root commands run as nobody, who may not reach this virtualenv's interpreter.
COMMAND_PY = (
    "/usr/bin/python3" if os.geteuid() == 0 and os.path.exists("/usr/bin/python3") else sys.executable
)


def run_all(run: Run) -> None:
    reason = reachable()
    if reason is not None:
        print(f"bench: replicas skipped: no PostgreSQL at {URL} ({reason})", file=sys.stderr, flush=True)
        run.note("replicas_skipped", reason)
        return
    folder = run.scratch("replicas")
    project = folder / "project"
    project.mkdir(parents=True, exist_ok=True)
    with schema() as url, _open_dir() as shared, contextlib.ExitStack() as stack:

        def replica(name: str) -> Product:
            extra = ["--allow-commands", "--resource-root", str(folder)]
            extra += ["--command-user", "nobody"] if os.geteuid() == 0 else []
            env = {"ACP_PLAN_LEASE_SECONDS": str(TAKEOVER_LEASE_S)}
            return stack.enter_context(Product(folder / name, db=url, extra=extra, env=env, role="admin"))

        smoke = run.mode.name == "smoke"
        a, b = replica("a"), replica("b")
        other, same = (sorted(found) for found in _event_latencies(a, b, 20 if smoke else 400))
        asyncio.run(_setup(a, project))
        frozen = _takeover(a, b, shared / "frozen", signal.SIGSTOP)
        # The smoke run (a test) starts no third server: the code is the same.
        if not smoke:
            run.note("takeover_killed_s", _takeover(replica("c"), b, shared / "killed", signal.SIGKILL))
    run.note("replica_event_latency_p50_ms", _percentile(other, 0.5))
    run.note("replica_event_latency_events", len(other))
    # The control: the same events at a subscriber of the replica that committed them.
    run.note("same_replica_event_latency_p50_ms", _percentile(same, 0.5))
    run.note("same_replica_event_latency_p99_ms", _percentile(same, 0.99))
    run.record("replica_event_latency_p99_ms", _percentile(other, 0.99))
    run.note("takeover_lease_s", TAKEOVER_LEASE_S)
    run.record("takeover_s", frozen)


def _percentile(ordered: list[float], share: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


# replica_event_latency ---------------------------------------------------------------------


def _event_latencies(a: Product, b: Product, tells: int) -> tuple[list[float], list[float]]:
    """Milliseconds from each event's time to its frame: at a subscriber of B (the other
    replica), and, as the control, at one of A (the replica that committed it)."""
    with httpx.Client(base_url=a.http_url, headers=a.auth_header, timeout=30) as client:
        created = client.post(
            "/api/v1/acp", content=orjson.dumps({"operation": "session.create", "params": {"title": "r"}})
        )
        session_id = created.raise_for_status().json()["data"]["session"]["meta"]["id"]
        arrivals: dict[str, list[tuple[float, bytes]]] = {"a": [], "b": []}
        for name, product in (("a", a), ("b", b)):
            ready = threading.Event()
            reader = threading.Thread(
                target=_subscribe, args=(product, session_id, arrivals[name], ready), daemon=True
            )
            reader.start()
            if not ready.wait(30):
                raise RuntimeError(f"the subscriber of replica {name} never opened its stream")
        for index in range(tells):
            body = {"operation": "session.tell", "params": {"session_id": session_id, "content": f"m{index}"}}
            client.post("/api/v1/acp", content=orjson.dumps(body)).raise_for_status()
            # Paced: a latency, not a queue under load.
            time.sleep(0.005)
    # Every tell's events (its message, and the orchestrator's answer), until quiet.
    deadline = time.monotonic() + 60
    seen = (-1, -1)
    while (
        min(len(arrivals["a"]), len(arrivals["b"])) < tells
        or (len(arrivals["a"]), len(arrivals["b"])) != seen
    ):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the subscribers got {len(arrivals['a'])} and {len(arrivals['b'])} events")
        seen = (len(arrivals["a"]), len(arrivals["b"]))
        time.sleep(0.5)
    a_ms, b_ms = ([(arrived - _event_time(data)) * 1000 for arrived, data in list(arrivals[n])] for n in "ab")
    return b_ms, a_ms


def _subscribe(
    product: Product, session_id: str, arrivals: list[tuple[float, bytes]], ready: threading.Event
) -> None:
    """Read B's stream in a thread of its own, stamping each frame as its data line arrives;
    it ends with the server."""
    with (
        contextlib.suppress(httpx.HTTPError),
        httpx.Client(base_url=product.http_url, headers=product.auth_header, timeout=None) as client,
        client.stream(
            "GET",
            "/api/v1/events/stream",
            params={"session_id": session_id},
            headers={"Accept": "text/event-stream"},
        ) as stream,
    ):
        ready.set()
        for line in stream.iter_lines():
            if line.startswith("data: "):
                arrivals.append((time.time(), line[6:].encode()))


def _event_time(data: bytes) -> float:
    stamp = orjson.loads(data)["time"]
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


# takeover ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _open_dir() -> Iterator[pathlib.Path]:
    """Where the step (run as nobody under root) writes its pid."""
    made = pathlib.Path(tempfile.mkdtemp(prefix="acp-bench-takeover-"))
    made.chmod(0o777)
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def _takeover(a: Product, b: Product, files: pathlib.Path, how: signal.Signals) -> float:
    """Seconds from stopping replica A mid-plan (``how``) to replica B having recorded the
    plan's outcome."""
    files.mkdir(mode=0o777)
    files.chmod(0o777)
    pid_file = files / "pid"
    plan_id = asyncio.run(_start_plan(a, pid_file, files / "never"))
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()):
        if time.monotonic() > deadline:
            raise RuntimeError("the plan's step never started on replica A")
        time.sleep(0.01)
    stopped = time.monotonic()
    os.kill(a.server.pid, how)
    try:
        return asyncio.run(_until_settled(b, plan_id, stopped))
    finally:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(a.server.pid, signal.SIGKILL)


async def _start_plan(product: Product, pid_file: pathlib.Path, gate: pathlib.Path) -> str:
    async with product.client() as client:
        used = await client.call(
            "plan.use",
            action="takeover",
            project="takeover",
            inputs={"pid_file": str(pid_file), "gate": str(gate)},
        )
        assert isinstance(used, plan_pb2.UsePlanResponse)
        await client.call("plan.execute", plan_id=used.plan.meta.id)
        return used.plan.meta.id


async def _setup(product: Product, project: pathlib.Path) -> None:
    async with product.client() as client:
        await _register(client, project)


async def _register(client: ACPClient, project: pathlib.Path) -> None:
    await client.call("resource.add", name="takeover", spec={"type": "directory", "path": str(project)})
    await client.call("project.add", name="takeover", spec={"resources": ["takeover"]})
    await client.call(
        "tool.add", name="wait", spec={"argv": [COMMAND_PY, "-c", WAITING, "{{pid_file}}", "{{gate}}"]}
    )
    await client.call("automation_profile.add", name="takeover", spec={"allowed_tools": ["wait"]})
    spec: dict[str, Any] = {
        "actor": "scripted",
        "prompt_template": "Wait.",
        "steps": [{"tool": "wait", "args": {"pid_file": "{{pid_file}}", "gate": "{{gate}}"}}],
        "automation_profile": "takeover",
    }
    await client.call("action.add", name="takeover", spec=spec)


async def _until_settled(product: Product, plan_id: str, stopped: float) -> float:
    async with product.client() as client:
        deadline = stopped + 120
        while time.monotonic() < deadline:
            status = await client.call("plan.status", plan_id=plan_id)
            assert isinstance(status, plan_pb2.GetPlanStatusResponse)
            if status.plan.state == plan_pb2.PLAN_STATE_FAILED:
                return time.monotonic() - stopped
            await asyncio.sleep(0.01)
    raise RuntimeError(f"replica B never settled plan {plan_id}")
