"""Unary figures over the wire: ``session.show`` over gRPC and through the HTTP gateway,
each divided by its raw echo server measured in the same run with the same generator.

- ``grpc_unary_ratio``: req/s at 16 in-flight calls / the raw grpc.aio echo's.
- ``gateway_envelope_ratio``: req/s of ``POST /api/v1/acp`` at 16 connections / the raw
  FastAPI echo's (same body); ``gateway_rest_ratio`` for ``GET /api/v1/sessions/{id}``.
- ``gateway_*_p50_ratio``/``_p99_ratio``: latency percentiles over the raw echo's.

Beside each: server CPU per request (``*_cpu_us``), read from /proc before and after.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import orjson

from bench import baselines, load
from bench.load import LoadResult
from bench.procs import CPUMeter, ServerProcess, python_module
from bench.product import Product
from bench.run import Run
from cleveragents.acp.contract import catalog
from cleveragents.acp.v1 import session_pb2

IN_FLIGHT = 16


async def seed_session(product: Product) -> tuple[str, int]:
    """A session to show, and the size of its ``session.show`` answer."""
    async with product.client() as client:
        created = await client.call("session.create", title="bench", labels={"team": "bench"})
        assert isinstance(created, session_pb2.CreateSessionResponse)
        shown = await client.call("session.show", session_id=created.session.meta.id)
    return created.session.meta.id, shown.ByteSize()


Generator = Callable[[float], LoadResult]


# Alternated rounds per mode (`alternated`), for figures comparing servers measured in turn.
PAIRS = {"smoke": 1, "quick": 3, "full": 5}


@dataclass(frozen=True)
class Measured:
    result: LoadResult
    cpu_us: float
    # Each server process's share of that CPU (the parent first, then its workers).
    shares: list[float]


def measure(run: Run, name: str, server: ServerProcess, generate: Generator) -> Measured:
    """One measured load of ``run``'s length and the server's CPU meanwhile; failed requests fail it."""
    meter = CPUMeter(server)
    meter.start()
    result = generate(run.mode.load_seconds)
    meter.stop()
    if result.errors:
        raise RuntimeError(f"{name}: {result.errors} of {result.requests} requests failed")
    return Measured(result, meter.us_per(result.requests), meter.shares)


def best_of(
    run: Run, entries: dict[str, tuple[ServerProcess, Generator]]
) -> dict[str, tuple[LoadResult, float]]:
    """Warm every server up, then measure each in turn, ``repeats`` times; keeps each one's
    best run (by req/s) and the server's CPU µs per request during it."""
    if run.mode.warmup_seconds:
        for _, generate in entries.values():
            generate(run.mode.warmup_seconds)
    best: dict[str, tuple[LoadResult, float]] = {}
    for _ in range(run.mode.repeats):
        for name, (server, generate) in entries.items():
            measured = measure(run, name, server, generate)
            if name not in best or measured.result.rps > best[name][0].rps:
                best[name] = (measured.result, measured.cpu_us)
    return best


def alternated(run: Run, entries: dict[str, tuple[ServerProcess, Generator]]) -> dict[str, list[Measured]]:
    """The loads of ``entries`` warmed up, then measured in ``PAIRS`` alternated rounds (one
    run of each; the order reverses every round, ABBA, so a drift of the machine's speed hits
    all alike); per round and load, its result and the server's CPU µs per request. Callers
    take the median of the rounds' ratios: steadier on a shared machine than the best run of
    each, which compares each side's least disturbed moment, not the same moment."""
    if run.mode.warmup_seconds:
        for _, generate in entries.values():
            generate(run.mode.warmup_seconds)
    names = list(entries)
    measured: dict[str, list[Measured]] = {name: [] for name in names}
    for index in range(PAIRS[run.mode.name]):
        for name in names if index % 2 == 0 else reversed(names):
            measured[name].append(measure(run, name, *entries[name]))
    return measured


def grpc_figures(run: Run, product: Product, session_id: str, response_bytes: int) -> None:
    payload = session_pb2.GetSessionRequest(session_id=session_id).SerializeToString()
    method = catalog.OPERATIONS["session.show"].full_method
    metadata = {"authorization": f"Bearer {product.token}"}
    with ServerProcess(
        python_module("bench.baselines", "grpc"),
        ready_prefix=baselines.READY,
        log=run.scratch("logs") / "grpc-echo.log",
    ) as echo:
        target = f"127.0.0.1:{echo.info['port']}"

        def raw_load(seconds: float) -> LoadResult:
            return load.grpc_load(
                target,
                baselines.ECHO_METHOD,
                payload,
                in_flight=IN_FLIGHT,
                seconds=seconds,
                response_bytes=len(payload),
                prefer=run.prefer,
            )

        def our_load(seconds: float) -> LoadResult:
            return load.grpc_load(
                product.grpc_target,
                method,
                payload,
                metadata=metadata,
                in_flight=IN_FLIGHT,
                seconds=seconds,
                response_bytes=response_bytes,
                prefer=run.prefer,
            )

        best = best_of(run, {"raw": (echo, raw_load), "ours": (product.server, our_load)})
    (raw, raw_cpu), (ours, ours_cpu) = best["raw"], best["ours"]
    by = ours.generator
    run.note("raw_grpc_echo_rps", raw.rps)
    run.note("raw_grpc_echo_p50_ms", raw.p50_ms)
    run.note("raw_grpc_echo_p99_ms", raw.p99_ms)
    run.note("raw_grpc_echo_cpu_us", raw_cpu)
    run.note("grpc_unary_cpu_us", ours_cpu)
    run.record("grpc_unary_rps", ours.rps, by)
    run.record("grpc_unary_p50_ms", ours.p50_ms, by)
    run.record("grpc_unary_p99_ms", ours.p99_ms, by)
    run.record("grpc_unary_ratio", ours.rps / raw.rps, by)


def _check_gateway(product: Product, session_id: str, body: bytes) -> None:
    """One call of each route answers the session, before any load is trusted."""
    headers = {**product.auth_header, "Content-Type": "application/json"}
    envelope = httpx.post(f"{product.http_url}/api/v1/acp", content=body, headers=headers, timeout=10)
    rest = httpx.get(f"{product.http_url}/api/v1/sessions/{session_id}", headers=headers, timeout=10)
    for response in (envelope, rest):
        if response.status_code != 200 or session_id not in response.text:
            raise RuntimeError(f"the gateway answered {response.status_code}: {response.text[:500]}")


def _http(run: Run, url: str, method: str, body: bytes, headers: dict[str, str]) -> Generator:
    def generate(seconds: float) -> LoadResult:
        return load.http_load(
            url,
            method=method,
            body=body,
            headers=headers,
            connections=IN_FLIGHT,
            seconds=seconds,
            prefer=run.prefer,
        )

    return generate


def gateway_figures(run: Run, product: Product, session_id: str) -> None:
    body = orjson.dumps({"operation": "session.show", "params": {"session_id": session_id}})
    _check_gateway(product, session_id, body)
    with ServerProcess(
        python_module("bench.baselines", "http"),
        ready_prefix=baselines.READY,
        log=run.scratch("logs") / "http-echo.log",
    ) as echo:
        raw_url = f"http://127.0.0.1:{echo.info['port']}/echo"
        envelope_url = f"{product.http_url}/api/v1/acp"
        rest_url = f"{product.http_url}/api/v1/sessions/{session_id}"
        best = best_of(
            run,
            {
                "raw": (echo, _http(run, raw_url, "POST", body, {})),
                "envelope": (product.server, _http(run, envelope_url, "POST", body, product.auth_header)),
                "rest": (product.server, _http(run, rest_url, "GET", b"", product.auth_header)),
            },
        )
    raw, raw_cpu = best["raw"]
    run.note("raw_http_echo_rps", raw.rps)
    run.note("raw_http_echo_p50_ms", raw.p50_ms)
    run.note("raw_http_echo_p99_ms", raw.p99_ms)
    run.note("raw_http_echo_cpu_us", raw_cpu)
    for name in ("envelope", "rest"):
        ours, ours_cpu = best[name]
        by = ours.generator
        run.note(f"gateway_{name}_rps", ours.rps)
        run.note(f"gateway_{name}_p50_ms", ours.p50_ms)
        run.note(f"gateway_{name}_p99_ms", ours.p99_ms)
        run.note(f"gateway_{name}_cpu_us", ours_cpu)
        run.record(f"gateway_{name}_ratio", ours.rps / raw.rps, by)
        run.record(f"gateway_{name}_p50_ratio", ours.p50_ms / raw.p50_ms, by)
        run.record(f"gateway_{name}_p99_ratio", ours.p99_ms / raw.p99_ms, by)


def read_cache_counts(product: Product) -> dict[str, float]:
    """The server's ``acp_store_read_cache_total`` by result (docs/observability.md)."""
    answer = httpx.get(f"{product.http_url}/metrics", headers=product.auth_header, timeout=10)
    answer.raise_for_status()
    counts = {"hit": 0.0, "miss": 0.0}
    for line in answer.text.splitlines():
        for result in counts:
            if line.startswith(f'acp_store_read_cache_total{{result="{result}"}} '):
                counts[result] = float(line.rsplit(" ", 1)[1])
    return counts


def run_all(run: Run) -> None:
    with Product(run.scratch("unary")) as product:
        session_id, response_bytes = asyncio.run(seed_session(product))
        grpc_figures(run, product, session_id, response_bytes)
        gateway_figures(run, product, session_id)
        # The shows above are of one session nobody changes: answered from memory
        # (docs/server.md, "Reads asked again"), which the details say.
        counts = read_cache_counts(product)
        run.note("unary_read_cache_hit_fraction", counts["hit"] / max(1.0, counts["hit"] + counts["miss"]))
