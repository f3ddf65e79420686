"""What a request id costs the server (docs/idempotency.md).

- ``idempotent_write_cpu_ratio``: server CPU per ``session.create`` over the envelope with a
  fresh request id of the caller's (stored, replayable) / without one (the server makes one up
  and stores nothing). Goal: <= 1.1.
- ``idempotent_read_cpu_ratio``: the same for the read-only ``session.show``: read-only
  operations store nothing, so about 1.

Rounds alternate the two kinds of call, several client threads at once, and keep each kind's
lowest CPU per call (other work on a shared machine only ever adds CPU).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import httpx
import orjson

from bench.procs import CPUMeter
from bench.product import Product
from bench.run import Run

CLIENTS = 4
# Calls per load and loads per kind of call: a load's CPU is read in 10 ms ticks, so it
# needs a second or so of it for a figure within about 1 %.
_COUNTS = {"smoke": 40, "quick": 1000, "full": 2000}
_ROUNDS = {"smoke": 1, "quick": 4, "full": 6}
# Each load's request ids are its own: every call with an id is a first call, never a replay.
_RUNS = itertools.count()


def _load(product: Product, count: int, body: Callable[[int], dict[str, object]], with_id: bool) -> float:
    """Server CPU microseconds per call for ``count`` envelope calls from CLIENTS threads."""
    numbers = itertools.count()
    run_id = next(_RUNS)
    lock = threading.Lock()
    failures: list[str] = []

    def worker() -> None:
        with httpx.Client(base_url=product.http_url, timeout=30, headers=product.auth_header) as client:
            while True:
                with lock:
                    n = next(numbers)
                if n >= count:
                    return
                payload = body(n)
                if with_id:
                    payload["request_id"] = f"bench-{run_id}-{n}"
                response = client.post("/api/v1/acp", content=orjson.dumps(payload))
                if response.status_code != 200 or "acp-replayed" in response.headers:
                    failures.append(response.text[:200])
                    return

    meter = CPUMeter(product.server)
    meter.start()
    threads = [threading.Thread(target=worker) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(600)
    meter.stop()
    if failures:
        raise RuntimeError(f"idempotency bench: a call failed or was a replay: {failures[0]}")
    return meter.us_per(count)


def run_all(run: Run) -> None:
    count = _COUNTS[run.mode.name]
    with Product(run.scratch("idempotency")) as product:
        # A session to show, made without a request id.
        with httpx.Client(base_url=product.http_url, timeout=30, headers=product.auth_header) as client:
            made = client.post(
                "/api/v1/acp",
                content=orjson.dumps({"operation": "session.create", "params": {"title": "shown"}}),
            ).json()
        session_id = made["data"]["session"]["meta"]["id"]

        def create(n: int) -> dict[str, object]:
            return {"operation": "session.create", "params": {"title": f"bench {n}"}}

        def show(n: int) -> dict[str, object]:
            return {"operation": "session.show", "params": {"session_id": session_id}}

        # Warm both paths once, unmeasured.
        for with_id in (False, True):
            _load(product, max(count // 10, 10), create, with_id)
        best: dict[tuple[str, bool], float] = {}
        for _ in range(_ROUNDS[run.mode.name]):
            for name, body in (("create", create), ("show", show)):
                for with_id in (False, True):
                    us = _load(product, count, body, with_id)
                    key = (name, with_id)
                    best[key] = min(best.get(key, us), us)
    for name, figure in (("create", "idempotent_write_cpu_ratio"), ("show", "idempotent_read_cpu_ratio")):
        run.record(figure, best[(name, True)] / best[(name, False)], "python-http")
        run.note(f"{figure}.with_id_us_per_call", best[(name, True)])
        run.note(f"{figure}.without_id_us_per_call", best[(name, False)])
