"""The gateway-only mode's hop (``agents gateway --upstream``) against the in-process gateway.

- ``upstream_gateway_ratio``: req/s of ``session.show`` over ``POST /api/v1/acp`` at 16
  connections, through ``agents gateway --upstream`` in front of ``agents serve``'s gRPC port /
  straight to that server's own (in-process) gateway. Same server, same session, same
  generator; runs of the two alternate (ABBA) and the figure is the median of the pairs' ratios.
- Beside it, CPU per request: ``upstream_gateway_cpu_us`` (the gateway process and the
  server together, the whole cost of a call through the hop) and ``upstream_inprocess_cpu_us``
  (the server alone); ``upstream_gateway_hop_cpu_us`` is the gateway process's share, and
  ``upstream_gateway_cpu_ratio`` the in-process CPU per request / the hop's (both processes).
"""

from __future__ import annotations

import asyncio
import statistics

import httpx
import orjson

from bench.load import LoadResult
from bench.procs import CPUMeter, ServerProcess
from bench.product import READY, Product, agents_command
from bench.run import Run
from bench.unary import IN_FLIGHT, _check_gateway, _http, seed_session

# Alternated pairs per mode (each pair: one run of each, the order swapped every pair).
_PAIRS = {"smoke": 1, "quick": 3, "full": 5}


def _gateway(run: Run, product: Product) -> ServerProcess:
    argv = [*agents_command(), "gateway", "--host", "127.0.0.1", "--http-port", "0"]
    argv += ["--upstream", product.grpc_target, "--log-level", "warning"]
    return ServerProcess(argv, ready_prefix=READY, log=run.scratch("logs") / "upstream-gateway.log")


def run_all(run: Run) -> None:
    with Product(run.scratch("upstream")) as product, _gateway(run, product) as gateway:
        session_id, _ = asyncio.run(seed_session(product))
        body = orjson.dumps({"operation": "session.show", "params": {"session_id": session_id}})
        _check_gateway(product, session_id, body)
        hop_url = f"{gateway.info['http']}/api/v1/acp"
        answer = httpx.post(hop_url, content=body, headers=product.auth_header, timeout=10)
        if answer.status_code != 200 or session_id not in answer.text:
            raise RuntimeError(f"the upstream gateway answered {answer.status_code}: {answer.text[:500]}")
        direct = _http(run, f"{product.http_url}/api/v1/acp", "POST", body, product.auth_header)
        hop = _http(run, hop_url, "POST", body, product.auth_header)
        if run.mode.warmup_seconds:
            direct(run.mode.warmup_seconds)
            hop(run.mode.warmup_seconds)
        ratios: list[float] = []
        measured: dict[str, list[tuple[LoadResult, float, float]]] = {"direct": [], "hop": []}
        for i in range(_PAIRS[run.mode.name]):
            order = ("direct", "hop") if i % 2 == 0 else ("hop", "direct")
            for name in order:
                server_cpu, gateway_cpu = CPUMeter(product.server), CPUMeter(gateway)
                server_cpu.start()
                gateway_cpu.start()
                result = (direct if name == "direct" else hop)(run.mode.load_seconds)
                server_cpu.stop()
                gateway_cpu.stop()
                if result.errors:
                    raise RuntimeError(f"{name}: {result.errors} of {result.requests} requests failed")
                measured[name].append(
                    (result, server_cpu.us_per(result.requests), gateway_cpu.us_per(result.requests))
                )
            ratios.append(measured["hop"][-1][0].rps / measured["direct"][-1][0].rps)
    by = measured["hop"][0][0].generator
    run.record("upstream_gateway_ratio", statistics.median(ratios), by)
    run.note("upstream_gateway_ratio_pairs", ratios)
    for name, key in (("direct", "upstream_inprocess"), ("hop", "upstream_gateway")):
        run.note(f"{key}_rps", statistics.median(r.rps for r, _, _ in measured[name]))
        run.note(f"{key}_p99_ms", statistics.median(r.p99_ms for r, _, _ in measured[name]))
    run.note("upstream_inprocess_cpu_us", statistics.median(s for _, s, _ in measured["direct"]))
    run.note("upstream_gateway_cpu_us", statistics.median(s + g for _, s, g in measured["hop"]))
    run.note("upstream_gateway_hop_cpu_us", statistics.median(g for _, _, g in measured["hop"]))
    run.note("upstream_gateway_server_cpu_us", statistics.median(s for _, s, _ in measured["hop"]))
    # Steadier than req/s on a shared box: the hop spreads over two processes and two cores.
    run.note(
        "upstream_gateway_cpu_ratio",
        statistics.median(s for _, s, _ in measured["direct"])
        / statistics.median(s + g for _, s, g in measured["hop"]),
    )
    run.note("upstream_gateway_in_flight", IN_FLIGHT)
