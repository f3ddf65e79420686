"""Where the server's time goes under one figure's load: py-spy samples ``agents serve``.

``python -m bench.profile envelope|create|rest|grpc|sse|sse-fanout [--seconds N] [--top N]`` starts the
server, puts the figure's load on it (wrk/h2load or the Python generators, SSE clients),
samples the server with ``py-spy record`` meanwhile, and prints the functions holding the
most samples: inclusive (the function or anything it called) and self. py-spy is a dev
dependency; it needs ptrace rights over the server (root, or ptrace_scope 0).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence

import orjson

from bench import load, streams
from bench.product import Product
from bench.unary import IN_FLIGHT, seed_session
from cleveragents.acp.contract import catalog
from cleveragents.acp.v1 import session_pb2

SSE_BACKLOG = 200_000
# The fan-out figure's shape: many subscribers reading the same events at once.
FANOUT = 100
FANOUT_EVENTS = 1000


def _loads(
    product: Product, session_id: str, response_bytes: int, seconds: float
) -> dict[str, Callable[[], object]]:
    body = orjson.dumps({"operation": "session.show", "params": {"session_id": session_id}})
    payload = session_pb2.GetSessionRequest(session_id=session_id).SerializeToString()
    stream_url = f"{product.http_url}/api/v1/events/stream"
    return {
        "envelope": lambda: load.http_load(
            f"{product.http_url}/api/v1/acp", body=body, headers=product.auth_header, seconds=seconds
        ),
        # write_read_ratio's write half: a new session per call, over the envelope.
        "create": lambda: load.http_load(
            f"{product.http_url}/api/v1/acp",
            body=orjson.dumps({"operation": "session.create", "params": {"title": "profiled"}}),
            headers=product.auth_header,
            seconds=seconds,
        ),
        "rest": lambda: load.http_load(
            f"{product.http_url}/api/v1/sessions/{session_id}",
            method="GET",
            headers=product.auth_header,
            seconds=seconds,
        ),
        "grpc": lambda: load.grpc_load(
            product.grpc_target,
            catalog.OPERATIONS["session.show"].full_method,
            payload,
            metadata={"authorization": f"Bearer {product.token}"},
            in_flight=IN_FLIGHT,
            seconds=seconds,
            response_bytes=response_bytes,
        ),
        "sse": lambda: streams.subscribe(stream_url, product.auth_header, 20, SSE_BACKLOG, seconds),
        "sse-fanout": lambda: _repeat(
            lambda: streams.subscribe(stream_url, product.auth_header, FANOUT, FANOUT_EVENTS, seconds),
            seconds,
        ),
    }


def _repeat(action: Callable[[], object], seconds: float) -> None:
    """``action`` again and again for ``seconds`` (a fan-out run is short)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        action()


def summarize(collapsed: str, top: int) -> str:
    """Inclusive and self sample shares per function, from py-spy's collapsed stacks."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [frame.split(" (")[0] + " (" + frame.split(" (")[-1] for frame in stack.split(";")]
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
    lines = [f"{total} samples"]
    for title, counter in (("inclusive", inclusive), ("self", own)):
        lines.append(f"\n{title}:")
        for frame, count in counter.most_common(top):
            lines.append(f"  {100 * count / total:5.1f}%  {frame}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__)
    parser.add_argument("figure", choices=["envelope", "create", "rest", "grpc", "sse", "sse-fanout"])
    parser.add_argument("--seconds", type=float, default=8)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument(
        "--db", metavar="URL", help="a postgresql:// URL: profile the server on PostgreSQL (not with sse)"
    )
    args = parser.parse_args(argv)
    spy = shutil.which("py-spy") or str(pathlib.Path(sys.executable).parent / "py-spy")
    if not pathlib.Path(spy).exists():
        print("py-spy is not installed: pip install -e '.[dev]'", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="acp-profile-") as tmp:
        folder = pathlib.Path(tmp)
        if args.figure.startswith("sse"):
            # Subscribers replay this backlog, as in the benchmark.
            streams.fill_log(folder / "acp.db", SSE_BACKLOG)
        with Product(folder, db=args.db or folder / "acp.db") as product:
            _profile(product, folder, args.figure, args.seconds, args.top, spy)
    return 0


def _profile(product: Product, folder: pathlib.Path, figure: str, seconds: float, top: int, spy: str) -> None:
    session_id, response_bytes = asyncio.run(seed_session(product))
    run_load = _loads(product, session_id, response_bytes, seconds + 2)[figure]
    loader = threading.Thread(target=run_load, daemon=True)
    loader.start()
    out = folder / "stacks.txt"
    argv = [spy, "record", "--pid", str(product.server.pid), "--duration", str(int(seconds))]
    argv += ["--rate", "250", "--format", "raw", "--output", str(out), "--nonblocking"]
    subprocess.run(
        argv,
        check=True,
        capture_output=True,
        timeout=seconds + 60,
    )
    loader.join(seconds + 60)
    print(summarize(out.read_text(), top))


if __name__ == "__main__":
    sys.exit(main())
