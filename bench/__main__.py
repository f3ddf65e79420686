"""``python -m bench [--quick | --smoke]``: measure every figure, write results.json, print a table."""

from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

from bench import (
    actors,
    approvals,
    editor,
    idempotency,
    layers,
    local,
    memory,
    neighbours,
    peer,
    postgres,
    replicas,
    report,
    scaling,
    storage,
    streams,
    unary,
    upstream,
    webhooks,
    workers,
)
from bench.modes import FULL, QUICK, SMOKE
from bench.run import Run

FAMILIES: dict[str, Callable[[Run], None]] = {
    "local": lambda run: asyncio.run(local.run_all(run)),
    "unary": unary.run_all,
    # agents gateway --upstream in front of agents serve, against its in-process gateway.
    "upstream": upstream.run_all,
    "streams": streams.run_all,
    "memory": memory.run_all,
    "neighbours": neighbours.run_all,
    "actors": actors.run_all,
    # agents editor (Zed ACP over stdio) against ACPClient on the same backend.
    "editor": editor.run_all,
    # Answer -> the resumed plan's next tool.invoked, in-process and over HTTP (ACP 1.3).
    "approvals": approvals.run_all,
    "scaling": scaling.run_all,
    # Only where a PostgreSQL is reachable (bench/postgres.py); otherwise it says so.
    "postgres": postgres.run_all,
    # Replicas over one PostgreSQL schema: event latency across them, plan takeover.
    "replicas": replicas.run_all,
    "storage": storage.run_all,
    "idempotency": idempotency.run_all,
    # agents serve --workers 2 against one worker: event latency across them, CPU per request.
    "workers": workers.run_all,
    # Each layer written under a library against that library's supported path (bench/layers.py).
    "layers": layers.run_all,
    # Webhook deliveries to a receiver on loopback: commit-to-receiver p99, throughput ratio.
    "webhooks": webhooks.run_all,
    # The A2A Python SDK's GetTask, from a virtualenv of its own (make bench-peer; bench/peer.py).
    "peer": peer.run_all,
}
# Families a --smoke run (the test suite's) leaves out unless named with --only: they
# measure software the project does not install (tests/bench/test_bench_peer.py checks the
# peer family's refusal without it).
NOT_IN_SMOKE = {"peer"}

DEFAULT_OUT = pathlib.Path(__file__).parent / "results.json"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="shorter measurements (under 2 minutes)")
    size.add_argument("--smoke", action="store_true", help="tiny measurements: proves the code runs")
    parser.add_argument("--only", action="append", choices=sorted(FAMILIES), help="run only these families")
    parser.add_argument(
        "--load",
        choices=["auto", "c", "python"],
        default="auto",
        help="load generators: wrk/h2load when installed (auto), required (c), or Python workers",
    )
    parser.add_argument("--out", type=pathlib.Path, default=DEFAULT_OUT, help="results file")
    args = parser.parse_args(argv)
    mode = SMOKE if args.smoke else QUICK if args.quick else FULL
    # The servers and load workers run ``python -m bench.…`` from wherever this runs.
    root = str(pathlib.Path(__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="acp-bench-") as workdir:
        run = Run(mode, pathlib.Path(workdir), prefer=args.load)
        names = args.only or [name for name in FAMILIES if mode is not SMOKE or name not in NOT_IN_SMOKE]
        for name in names:
            print(f"bench: {name} ...", file=sys.stderr, flush=True)
            begun = time.monotonic()
            FAMILIES[name](run)
            print(f"bench: {name} done in {time.monotonic() - begun:.1f} s", file=sys.stderr, flush=True)
    doc = report.document(run, time.monotonic() - started)
    report.write(args.out, doc)
    print(report.table(doc))
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
