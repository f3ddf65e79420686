"""Load generators, always in processes other than the server's.

Out-of-process C generators are preferred, since a Python client on the same two cores
measures itself as much as the server: ``wrk`` for HTTP, ``h2load`` (nghttp2-client) for
gRPC unary. Where they are missing, Python generators (httpx, grpc.aio) run in worker
processes of their own. Each result says which generator measured it.

``python -m bench.load http|grpc SPEC_JSON`` is one Python worker; it prints one
``bench-result {json}`` line.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

RESULT = "bench-result "
PYTHON_WORKERS = 2


@dataclass(frozen=True)
class LoadResult:
    generator: str
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return float(ordered[rank - 1])


def available(tool: str) -> bool:
    return shutil.which(tool) is not None


def choose(tool: str, prefer: str) -> str:
    """``prefer`` is ``auto`` (the C tool when installed), ``c`` or ``python``."""
    if prefer == "python":
        return "python"
    if available(tool):
        return tool
    if prefer == "c":
        raise RuntimeError(f"{tool} is not installed (make bench-tools installs it)")
    return "python"


def _result_line(output: str) -> dict[str, Any]:
    for line in output.splitlines():
        if line.startswith(RESULT):
            parsed: dict[str, Any] = json.loads(line[len(RESULT) :])
            return parsed
    raise RuntimeError(f"no result line in the generator's output:\n{output[-3000:]}")


# wrk ------------------------------------------------------------------------------------

_WRK_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "bench-result {\\"requests\\": %d, \\"duration_us\\": %d, \\"socket_errors\\": %d, "
    .. "\\"status_errors\\": %d, \\"p50_us\\": %d, \\"p99_us\\": %d}\\n",
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99)))
end
"""


def _wrk(
    url: str, method: str, body: bytes, headers: Mapping[str, str], connections: int, seconds: float
) -> LoadResult:
    with tempfile.TemporaryDirectory() as tmp:
        script = pathlib.Path(tmp) / "bench.lua"
        text = body.decode()
        if "]==]" in text:
            raise ValueError("the body cannot be quoted for wrk")
        script.write_text(f'wrk.method = "{method}"\nwrk.body = [==[{text}]==]\n{_WRK_DONE}')
        argv = ["wrk", "-t", "1", "-c", str(connections), "-d", f"{max(1, round(seconds))}s"]
        argv += ["--timeout", "10s", "-s", str(script)]
        for key, value in headers.items():
            argv += ["-H", f"{key}: {value}"]
        done = subprocess.run([*argv, url], capture_output=True, text=True, timeout=seconds + 60, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"wrk failed: {done.stderr or done.stdout}")
    found = _result_line(done.stdout)
    return LoadResult(
        generator="wrk",
        requests=int(found["requests"]),
        errors=int(found["socket_errors"]) + int(found["status_errors"]),
        seconds=found["duration_us"] / 1e6,
        p50_ms=found["p50_us"] / 1000,
        p99_ms=found["p99_us"] / 1000,
    )


# h2load ---------------------------------------------------------------------------------

_H2_FINISHED = re.compile(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s")
_H2_REQUESTS = re.compile(r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded")
_H2_DATA = re.compile(r"\((\d+)\) data")


def grpc_frame(payload: bytes) -> bytes:
    """A gRPC length-prefixed message (uncompressed)."""
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


def _h2load(
    target: str,
    method: str,
    payload: bytes,
    metadata: Mapping[str, str],
    in_flight: int,
    seconds: float,
    response_bytes: int | None,
) -> LoadResult:
    clients = 4 if in_flight % 4 == 0 else 1
    with tempfile.TemporaryDirectory() as tmp:
        body = pathlib.Path(tmp) / "body"
        body.write_bytes(grpc_frame(payload))
        log = pathlib.Path(tmp) / "requests.log"
        argv = ["h2load", "-t", "1", "-c", str(clients), "-m", str(in_flight // clients)]
        argv += ["-D", f"{max(1, round(seconds))}", "-d", str(body), f"--log-file={log}"]
        argv += ["-H", "content-type: application/grpc", "-H", "te: trailers"]
        for key, value in metadata.items():
            argv += ["-H", f"{key}: {value}"]
        done = subprocess.run(
            [*argv, f"http://{target}{method}"],
            capture_output=True,
            text=True,
            timeout=seconds + 60,
            check=False,
        )
        latencies = [int(line.split("\t")[2]) / 1000 for line in log.read_text().splitlines() if line]
    finished = _H2_FINISHED.search(done.stdout)
    counts = _H2_REQUESTS.search(done.stdout)
    if done.returncode != 0 or finished is None or counts is None:
        raise RuntimeError(f"h2load failed: {done.stderr or done.stdout}")
    elapsed = float(finished.group(1)) / (1000 if finished.group(2) == "ms" else 1)
    total, succeeded = int(counts.group(3)), int(counts.group(4))
    errors = total - succeeded
    data = _H2_DATA.search(done.stdout)
    if response_bytes is not None and data is not None and succeeded:
        # gRPC errors answer HTTP 200 without a message: count calls whose data is missing.
        expected = response_bytes + 5
        short = max(0, succeeded * expected - int(data.group(1)))
        errors += math.ceil(short / expected)
    return LoadResult(
        generator="h2load",
        requests=total,
        errors=errors,
        seconds=elapsed,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
    )


# Python workers ---------------------------------------------------------------------------


async def _closed_loop(calls: Sequence[Callable[[], Awaitable[bool]]], seconds: float) -> dict[str, Any]:
    """Each call function is one in-flight request at a time, until the deadline."""
    deadline = time.perf_counter() + seconds
    latencies: list[float] = []
    errors = 0

    async def one(call: Callable[[], Awaitable[bool]]) -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            try:
                ok = await asyncio.wait_for(call(), 10)
            except Exception:
                ok = False
            if ok:
                latencies.append((time.perf_counter() - started) * 1000)
            else:
                errors += 1

    started = time.perf_counter()
    await asyncio.gather(*(one(call) for call in calls))
    return {
        "seconds": time.perf_counter() - started,
        "latencies_ms": [round(value, 3) for value in latencies],
        "errors": errors,
    }


async def _http_connection(spec: dict[str, Any], host: str, port: int) -> Callable[[], Awaitable[bool]]:
    """One keep-alive HTTP/1.1 connection on bare asyncio streams (httpx costs more CPU
    than the server it measures). Responses must carry Content-Length."""
    reader, writer = await asyncio.open_connection(host, port)
    body = base64.b64decode(spec["body"])
    head = f"{spec['method']} {spec['path']} HTTP/1.1\r\nHost: {host}:{port}\r\n"
    head += "".join(f"{key}: {value}\r\n" for key, value in spec["headers"].items())
    if body:
        head += f"Content-Length: {len(body)}\r\n"
    request = head.encode() + b"\r\n" + body

    async def call() -> bool:
        writer.write(request)
        headers = await reader.readuntil(b"\r\n\r\n")
        status = int(headers.split(b" ", 2)[1])
        length = 0
        for line in headers.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await reader.readexactly(length)
        return status < 300

    return call


async def _http_worker(spec: dict[str, Any]) -> dict[str, Any]:
    from urllib.parse import urlsplit

    url = urlsplit(spec["url"])
    spec = {**spec, "path": url.path + (f"?{url.query}" if url.query else "")}
    calls = [
        await _http_connection(spec, url.hostname or "127.0.0.1", url.port or 80)
        for _ in range(spec["concurrency"])
    ]
    return await _closed_loop(calls, spec["seconds"])


async def _grpc_worker(spec: dict[str, Any]) -> dict[str, Any]:
    import grpc

    payload = base64.b64decode(spec["body"])
    metadata = tuple(spec["metadata"].items())
    async with grpc.aio.insecure_channel(spec["target"], options=[("grpc.so_reuseport", 0)]) as channel:
        rpc = channel.unary_unary(spec["method"], request_serializer=None, response_deserializer=None)

        async def call() -> bool:
            await rpc(payload, metadata=metadata)
            return True

        return await _closed_loop([call] * spec["concurrency"], spec["seconds"])


def _python(kind: str, spec: dict[str, Any], in_flight: int, seconds: float) -> LoadResult:
    workers = min(PYTHON_WORKERS, in_flight)
    procs = []
    for index in range(workers):
        share = in_flight // workers + (1 if index < in_flight % workers else 0)
        worker_spec = json.dumps({**spec, "concurrency": share, "seconds": seconds})
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "bench.load", kind, worker_spec],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    latencies: list[float] = []
    errors = 0
    elapsed = 0.0
    for proc in procs:
        out, err = proc.communicate(timeout=seconds + 60)
        if proc.returncode != 0:
            raise RuntimeError(f"load worker failed: {err[-3000:]}")
        found = _result_line(out)
        latencies += found["latencies_ms"]
        errors += int(found["errors"])
        elapsed = max(elapsed, float(found["seconds"]))
    return LoadResult(
        generator=f"python-{kind}",
        requests=len(latencies) + errors,
        errors=errors,
        seconds=elapsed,
        p50_ms=percentile(latencies, 50),
        p99_ms=percentile(latencies, 99),
    )


# entry points -----------------------------------------------------------------------------


def http_load(
    url: str,
    *,
    method: str = "POST",
    body: bytes = b"",
    headers: Mapping[str, str] | None = None,
    connections: int = 16,
    seconds: float = 5,
    prefer: str = "auto",
) -> LoadResult:
    headers = {"Content-Type": "application/json", **(headers or {})} if body else dict(headers or {})
    if choose("wrk", prefer) == "wrk":
        return _wrk(url, method, body, headers, connections, seconds)
    spec = {"url": url, "method": method, "body": base64.b64encode(body).decode(), "headers": headers}
    return _python("http", spec, connections, seconds)


def grpc_load(
    target: str,
    method: str,
    payload: bytes,
    *,
    metadata: Mapping[str, str] | None = None,
    in_flight: int = 16,
    seconds: float = 5,
    response_bytes: int | None = None,
    prefer: str = "auto",
) -> LoadResult:
    """``response_bytes``: the size of a good answer, so h2load can tell gRPC errors."""
    if choose("h2load", prefer) == "h2load":
        return _h2load(target, method, payload, metadata or {}, in_flight, seconds, response_bytes)
    spec = {
        "target": target,
        "method": method,
        "body": base64.b64encode(payload).decode(),
        "metadata": dict(metadata or {}),
    }
    return _python("grpc", spec, in_flight, seconds)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.load")
    parser.add_argument("kind", choices=["http", "grpc"])
    parser.add_argument("spec")
    args = parser.parse_args(argv)
    spec = json.loads(args.spec)
    worker = _http_worker if args.kind == "http" else _grpc_worker
    print(RESULT + json.dumps(asyncio.run(worker(spec))), flush=True)


if __name__ == "__main__":
    main()
