"""The product against the peer a user would otherwise pick: the A2A Python SDK (issue 35).

- ``grpc_vs_peer_ratio``: req/s of the product's ``session.show`` over gRPC / the SDK's
  ``GetTask`` over gRPC, both at 16 in-flight calls from the same generator (h2load).
- ``http_vs_peer_ratio``: req/s of ``session.show`` over the product's HTTP envelope
  (``POST /api/v1/acp``) / the SDK's ``GetTask`` over HTTP JSON-RPC, 16 connections (wrk).

Both are point reads of one stored record of about the same size (105 and 131 bytes of
protobuf), made over and over. The two servers run at once, each in a process of its own;
their loads alternate in pairs (ABBA) and each figure is the median of the pairs' ratios.
Server CPU per request (``/proc/<pid>/stat``) of each in the details.

The peer runs from a virtualenv of its own (``make bench-peer``: ``.build/peer``, or
``$ACP_BENCH_PEER``), never the project's, so its pins never meet ours. Without it the family
says so loudly and records nothing; under ``CI=true`` it fails.
"""

from __future__ import annotations

import asyncio
import base64
import os
import pathlib
import statistics
import sys

import grpc
import httpx
import orjson

from bench import load
from bench.load import LoadResult
from bench.peer_server import GRPC_METHOD, JSONRPC_PATH, VERSION, VERSION_HEADER
from bench.procs import ServerProcess
from bench.product import Product
from bench.run import Run
from bench.serving import READY
from bench.unary import IN_FLIGHT, Generator, Measured, _check_gateway, _http, alternated, seed_session
from cleveragents.acp.contract import catalog
from cleveragents.acp.v1 import session_pb2

ROOT = pathlib.Path(__file__).resolve().parent.parent
VENV = pathlib.Path(os.environ.get("ACP_BENCH_PEER", ROOT / ".build" / "peer"))


def missing() -> str | None:
    """Why the peer cannot be measured here, or None."""
    python = VENV / "bin" / "python"
    if not python.exists():
        return f"no peer virtualenv at {VENV} (make bench-peer makes it; make bench runs that)"
    return None


def _refuse(run: Run, reason: str) -> None:
    message = f"!!! bench: peer NOT MEASURED, grpc_vs_peer_ratio and http_vs_peer_ratio missing: {reason}"
    print(message, file=sys.stderr, flush=True)
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError(f"required under CI=true: {message}")
    run.note("peer_skipped", reason)


# The peer as uvicorn[standard] runs it (uvloop, httptools: its fastest stock setup, the
# figures' denominator), and as the SDK's samples run it (plain uvicorn: h11, asyncio's loop;
# in the details).
SETUPS = {"sdk": [], "sdk_plain": ["--loop", "asyncio", "--http", "h11"]}


def _peer(run: Run, name: str) -> ServerProcess:
    return ServerProcess(
        [str(VENV / "bin" / "python"), "-m", "bench.peer_server", *SETUPS[name]],
        ready_prefix=READY,
        log=run.scratch("logs") / f"{name}.log",
        env={"PYTHONPATH": str(ROOT)},
    )


def _check_peer(http_url: str, grpc_target: str, body: bytes, request: bytes, task_id: str) -> None:
    """One call of each answers the task, before any load is trusted."""
    answer = httpx.post(
        http_url,
        content=body,
        headers={"Content-Type": "application/json", VERSION_HEADER: VERSION},
        timeout=10,
    )
    if answer.status_code != 200 or task_id not in answer.text or '"error"' in answer.text:
        raise RuntimeError(f"the peer's JSON-RPC answered {answer.status_code}: {answer.text[:500]}")
    with grpc.insecure_channel(grpc_target) as channel:
        call = channel.unary_unary(GRPC_METHOD, request_serializer=None, response_deserializer=None)
        if task_id.encode() not in call(request, timeout=10, metadata=((VERSION_HEADER.lower(), VERSION),)):
            raise RuntimeError("the peer's gRPC GetTask did not answer the task")


def _grpc(
    run: Run, target: str, method: str, payload: bytes, metadata: dict[str, str], size: int
) -> Generator:
    def generate(seconds: float) -> LoadResult:
        return load.grpc_load(
            target,
            method,
            payload,
            metadata=metadata,
            in_flight=IN_FLIGHT,
            seconds=seconds,
            response_bytes=size,
            prefer=run.prefer,
        )

    return generate


def _ratio(run: Run, name: str, measured: dict[str, list[Measured]], ours: str, theirs: str) -> float:
    """The median of the rounds' req/s ratios; the rounds' own and the CPU ratio beside it."""
    ratios = [a.result.rps / b.result.rps for a, b in zip(measured[ours], measured[theirs], strict=True)]
    run.note(f"{name}_rounds", ratios)
    run.note(
        f"{name.removesuffix('_ratio')}_cpu_ratio",
        statistics.median(m.cpu_us for m in measured[theirs])
        / statistics.median(m.cpu_us for m in measured[ours]),
    )
    return statistics.median(ratios)


def _sides(run: Run, measured: dict[str, list[Measured]]) -> None:
    for side, runs in measured.items():
        run.note(f"peer_{side}_rps", statistics.median(m.result.rps for m in runs))
        run.note(f"peer_{side}_p99_ms", statistics.median(m.result.p99_ms for m in runs))
        run.note(f"peer_{side}_cpu_us", statistics.median(m.cpu_us for m in runs))


def run_all(run: Run) -> None:
    reason = missing()
    if reason is not None:
        _refuse(run, reason)
        return
    with Product(run.scratch("peer")) as product, _peer(run, "sdk") as sdk, _peer(run, "sdk_plain") as plain:
        session_id, response_bytes = asyncio.run(seed_session(product))
        body = orjson.dumps({"operation": "session.show", "params": {"session_id": session_id}})
        _check_gateway(product, session_id, body)
        show = session_pb2.GetSessionRequest(session_id=session_id).SerializeToString()
        grpc_loads: dict[str, tuple[ServerProcess, Generator]] = {
            "grpc": (
                product.server,
                _grpc(
                    run,
                    product.grpc_target,
                    catalog.OPERATIONS["session.show"].full_method,
                    show,
                    {"authorization": f"Bearer {product.token}"},
                    response_bytes,
                ),
            )
        }
        http_loads: dict[str, tuple[ServerProcess, Generator]] = {
            "envelope": (
                product.server,
                _http(run, f"{product.http_url}/api/v1/acp", "POST", body, product.auth_header),
            )
        }
        for name, peer in (("sdk", sdk), ("sdk_plain", plain)):
            task_id: str = peer.info["task_id"]
            request = base64.b64decode(peer.info["get_task_request"])
            target = f"127.0.0.1:{peer.info['grpc']}"
            url = f"http://127.0.0.1:{peer.info['http']}{JSONRPC_PATH}"
            rpc = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": task_id}})
            _check_peer(url, target, rpc, request, task_id)
            metadata = {VERSION_HEADER.lower(): VERSION}
            grpc_loads[f"{name}_grpc"] = (
                peer,
                _grpc(run, target, GRPC_METHOD, request, metadata, peer.info["task_bytes"]),
            )
            http_loads[f"{name}_jsonrpc"] = (peer, _http(run, url, "POST", rpc, {VERSION_HEADER: VERSION}))
        grpc_rounds = alternated(run, grpc_loads)
        http_rounds = alternated(run, http_loads)
    for name, rounds, ours, theirs in (
        ("grpc_vs_peer_ratio", grpc_rounds, "grpc", "sdk_grpc"),
        ("http_vs_peer_ratio", http_rounds, "envelope", "sdk_jsonrpc"),
        ("grpc_vs_plain_peer_ratio", grpc_rounds, "grpc", "sdk_plain_grpc"),
        ("http_vs_plain_peer_ratio", http_rounds, "envelope", "sdk_plain_jsonrpc"),
    ):
        ratio = _ratio(run, name, rounds, ours, theirs)
        if "plain" in name:  # beside the figures, not one
            run.note(name, ratio)
        else:
            run.record(name, ratio, rounds[ours][0].result.generator)
    _sides(run, grpc_rounds)
    _sides(run, http_rounds)
    run.note("peer_versions", sdk.info["versions"])
    run.note(
        "peer_setups",
        {
            name: f"{p.info['loop']}, {p.info['http_protocol']}"
            for name, p in (("sdk", sdk), ("sdk_plain", plain))
        },
    )
    run.note("peer_task_bytes", sdk.info["task_bytes"])
    run.note("peer_session_show_bytes", response_bytes)
