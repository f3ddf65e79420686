"""Storage off the event loop (issue 19): what one call's storage costs the others.

- ``loop_stall_ms``: the worst ``session.show`` latency (one call at a time over gRPC, every
  few milliseconds) while another process holds the SQLite write lock for 2 s and a
  ``session.create`` waits for it. Before the store had its own threads, every call waited
  with the blocked write (3-4.7 s).
- ``write_read_ratio``: ``session.create`` req/s / ``session.show`` req/s over the envelope
  at 16 connections, measured in turn: what a write costs beside a read (one group commit,
  off the loop). Beside it the server's CPU µs per call of each, steadier on a busy machine.
- ``mixed_read_p99_ratio``: ``session.show`` p99 over the envelope at 8 connections while
  8 connections of ``session.tell`` run / the same p99 without them.

Beside them (details): the blocked write's outcome and latency, each load's req/s and
percentiles. Every measurement is bounded by the mode's durations and a timeout per call.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from typing import Any

import orjson

from bench import load
from bench.load import LoadResult
from bench.procs import CPUMeter
from bench.product import Product
from bench.run import Run
from bench.unary import seed_session
from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.contract.errors import ACPError

LOCK_SECONDS = 2.0
PROBE_INTERVAL = 0.005
CALL_TIMEOUT = 30.0
CONNECTIONS = 16
MIXED = 8
LOCKED = "locked"

# Holds the write lock of the file named by argv[1] for argv[2] seconds, as a local CLI,
# a backup or an sqlite3 shell would.
_HOLDER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("ROLLBACK")
db.close()
"""


async def _stall(product: Product, session_id: str, seconds: float) -> dict[str, Any]:
    """Probe ``session.show`` while a foreign process holds the lock and a write waits."""
    async with ACPClient(
        GrpcTransport.connect(product.grpc_target, timeout=CALL_TIMEOUT), token=product.token
    ) as client:
        for _ in range(20):
            await client.call("session.show", session_id=session_id)
        holder = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _HOLDER, str(product.db), str(seconds), stdout=subprocess.PIPE
        )
        try:
            assert holder.stdout is not None
            line = await asyncio.wait_for(holder.stdout.readline(), CALL_TIMEOUT)
            if line.strip() != LOCKED.encode():
                raise RuntimeError(f"the lock holder said {line!r}")
            locked_at = time.perf_counter()
            write = asyncio.create_task(_timed_write(client))
            worst = 0.0
            probes = 0
            while time.perf_counter() - locked_at < seconds:
                started = time.perf_counter()
                await client.call("session.show", session_id=session_id)
                worst = max(worst, time.perf_counter() - started)
                probes += 1
                await asyncio.sleep(PROBE_INTERVAL)
            outcome, write_seconds = await write
        finally:
            if holder.returncode is None:
                holder.kill()
            await asyncio.wait_for(holder.wait(), CALL_TIMEOUT)
    return {"worst_ms": worst * 1000, "probes": probes, "write": outcome, "write_ms": write_seconds * 1000}


async def _timed_write(client: ACPClient) -> tuple[str, float]:
    started = time.perf_counter()
    try:
        await client.call("session.create", title="blocked")
        outcome = "committed"
    except ACPError as err:
        outcome = f"{err.code}/{err.details.get('refinement', '')}"
    return outcome, time.perf_counter() - started


def _envelope(product: Product, run: Run, operation: str, params: dict[str, Any], connections: int) -> Any:
    body = orjson.dumps({"operation": operation, "params": params})

    def generate(seconds: float) -> LoadResult:
        return load.http_load(
            f"{product.http_url}/api/v1/acp",
            body=body,
            headers=product.auth_header,
            connections=connections,
            seconds=seconds,
            prefer=run.prefer,
        )

    return generate


def _best(run: Run, product: Product, loads: dict[str, Any]) -> dict[str, tuple[LoadResult, float]]:
    """Warm up, then the loads in turn, the mode's repeats times (so a burst of other work on
    the machine hits both sides alike); each one's best run by req/s, with the server's CPU
    µs per request during it. Errors void the figure."""
    if run.mode.warmup_seconds:
        for generate in loads.values():
            generate(run.mode.warmup_seconds)
    best: dict[str, tuple[LoadResult, float]] = {}
    for _ in range(run.mode.repeats):
        for name, generate in loads.items():
            meter = CPUMeter(product.server)
            meter.start()
            result = generate(run.mode.load_seconds)
            meter.stop()
            if result.errors:
                raise RuntimeError(f"{name}: {result.errors} of {result.requests} requests failed")
            if name not in best or result.rps > best[name][0].rps:
                best[name] = (result, meter.us_per(result.requests))
    return best


def _mixed(run: Run, product: Product, session_id: str, tell_session: str) -> tuple[LoadResult, LoadResult]:
    """``session.show`` at 8 connections alone, then beside 8 connections of ``session.tell``
    (started first, running longer than the reads); each the best of the mode's repeats by p99."""
    show = _envelope(product, run, "session.show", {"session_id": session_id}, MIXED)
    tell = _envelope(product, run, "session.tell", {"session_id": tell_session, "content": "/help"}, MIXED)
    alone: LoadResult | None = None
    beside: LoadResult | None = None
    for _ in range(run.mode.repeats):
        result = show(run.mode.load_seconds)
        if alone is None or result.p99_ms < alone.p99_ms:
            alone = result
        told: list[LoadResult] = []
        writer = threading.Thread(
            target=_collect, args=(tell, run.mode.load_seconds + 1.0, told), name="tell-load", daemon=True
        )
        writer.start()
        time.sleep(0.5)
        result = show(run.mode.load_seconds)
        writer.join(run.mode.load_seconds + 90)
        if not told:
            raise RuntimeError("the session.tell load did not finish")
        if result.errors or told[0].errors:
            raise RuntimeError(f"errors under mixed load: show {result.errors}, tell {told[0].errors}")
        if beside is None or result.p99_ms < beside.p99_ms:
            beside = result
        run.note("mixed_tell_rps", told[0].rps)
    assert alone is not None
    assert beside is not None
    return alone, beside


def _collect(generate: Any, seconds: float, into: list[LoadResult]) -> None:
    into.append(generate(seconds))


async def _tell_session(product: Product) -> str:
    async with product.client() as client:
        created = await client.call("session.create", title="told")
        return str(created.session.meta.id)  # type: ignore[attr-defined]


def run_all(run: Run) -> None:
    with Product(run.scratch("storage")) as product:
        session_id, _ = asyncio.run(seed_session(product))
        stall = asyncio.run(_stall(product, session_id, LOCK_SECONDS))
        run.record("loop_stall_ms", stall["worst_ms"], "python-grpc")
        run.note("loop_stall_probes", stall["probes"])
        run.note("loop_stall_blocked_write", stall["write"])
        run.note("loop_stall_blocked_write_ms", stall["write_ms"])

        best = _best(
            run,
            product,
            {
                "show": _envelope(product, run, "session.show", {"session_id": session_id}, CONNECTIONS),
                "create": _envelope(product, run, "session.create", {"title": "bench"}, CONNECTIONS),
            },
        )
        (show, show_cpu), (create, create_cpu) = best["show"], best["create"]
        run.note("envelope_show_rps", show.rps)
        run.note("envelope_show_cpu_us", show_cpu)
        run.note("envelope_create_rps", create.rps)
        run.note("envelope_create_cpu_us", create_cpu)
        run.note("envelope_create_p99_ms", create.p99_ms)
        run.record("write_read_ratio", create.rps / show.rps, create.generator)

        tell_session = asyncio.run(_tell_session(product))
        alone, beside = _mixed(run, product, session_id, tell_session)
        run.note("mixed_show_alone_p99_ms", alone.p99_ms)
        run.note("mixed_show_beside_tell_p99_ms", beside.p99_ms)
        run.record("mixed_read_p99_ratio", beside.p99_ms / alone.p99_ms, beside.generator)
