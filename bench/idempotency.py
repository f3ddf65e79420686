"""What a request id costs the server (docs/idempotency.md).

- ``idempotent_write_cpu_ratio``: server CPU per ``session.create`` over the envelope with a
  fresh request id of the caller's (stored, replayable) / without one (the server makes one up
  and stores nothing). Goal: <= 1.1.
- ``idempotent_read_cpu_ratio``: the same for the read-only ``session.show``: read-only
  operations store nothing, so about 1.

Batches with and without an id alternate (ABBA), from CLIENTS threads with kept connections;
the server's CPU is read per batch in nanoseconds (``/proc/<pid>/task/*/schedstat``, every
thread), and the figure is the median of the batch pairs' ratios: a shared machine's load
changes from one second to the next, and a pair sees nearly the same load.
"""

from __future__ import annotations

import itertools
import pathlib
import statistics
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson

from bench.product import Product
from bench.run import Run

CLIENTS = 4
# Calls per batch, and batch pairs per kind of call.
_BATCH = {"smoke": 20, "quick": 200, "full": 300}
_PAIRS = {"smoke": 2, "quick": 12, "full": 20}
# Each batch's request ids are its own: every call with an id is a first call, never a replay.
_BATCHES = itertools.count()

Body = Callable[[int], dict[str, object]]


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of a process so far, in nanoseconds."""
    total = 0
    for stat in pathlib.Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


class Load:
    """CLIENTS threads, each with its own kept connection, sending envelope calls."""

    def __init__(self, product: Product) -> None:
        self.product = product
        self.pool = ThreadPoolExecutor(CLIENTS, thread_name_prefix="bench-idem")
        self.local = threading.local()
        self.clients: list[httpx.Client] = []
        self.lock = threading.Lock()

    def client(self) -> httpx.Client:
        client: httpx.Client | None = getattr(self.local, "client", None)
        if client is None:
            product = self.product
            client = httpx.Client(base_url=product.http_url, timeout=30, headers=product.auth_header)
            self.local.client = client
            with self.lock:
                self.clients.append(client)
        return client

    def _send(self, payload: dict[str, object]) -> None:
        response = self.client().post("/api/v1/acp", content=orjson.dumps(payload))
        if response.status_code != 200 or "acp-replayed" in response.headers:
            raise RuntimeError(f"idempotency bench: a call failed or was a replay: {response.text[:200]}")

    def batch(self, count: int, body: Body, with_id: bool) -> float:
        """Server CPU microseconds per call of one batch."""
        batch = next(_BATCHES)
        payloads = []
        for n in range(count):
            payload = body(n)
            if with_id:
                payload["request_id"] = f"bench-{batch}-{n}"
            payloads.append(payload)
        before = cpu_ns(self.product.server.pid)
        list(self.pool.map(self._send, payloads))
        return (cpu_ns(self.product.server.pid) - before) / count / 1000

    def close(self) -> None:
        self.pool.shutdown(wait=True)
        for client in self.clients:
            client.close()


def _pairs(load: Load, count: int, pairs: int, body: Body) -> tuple[float, float, float]:
    """(median ratio with/without, median µs with, median µs without) over ``pairs`` pairs."""
    ratios, with_us, without_us = [], [], []
    for i in range(pairs):
        order = (False, True) if i % 2 == 0 else (True, False)
        measured = {with_id: load.batch(count, body, with_id) for with_id in order}
        ratios.append(measured[True] / measured[False])
        with_us.append(measured[True])
        without_us.append(measured[False])
    return statistics.median(ratios), statistics.median(with_us), statistics.median(without_us)


def run_all(run: Run) -> None:
    count, pairs = _BATCH[run.mode.name], _PAIRS[run.mode.name]
    with Product(run.scratch("idempotency")) as product:
        load = Load(product)
        try:
            # A session to show, made without a request id.
            made = load.client().post(
                "/api/v1/acp",
                content=orjson.dumps({"operation": "session.create", "params": {"title": "shown"}}),
            )
            session_id = made.json()["data"]["session"]["meta"]["id"]

            def create(n: int) -> dict[str, object]:
                return {"operation": "session.create", "params": {"title": f"bench {n}"}}

            def show(n: int) -> dict[str, object]:
                return {"operation": "session.show", "params": {"session_id": session_id}}

            # Warm both paths (connections, caches), unmeasured.
            for body in (create, show):
                for with_id in (False, True):
                    load.batch(count, body, with_id)
            figures = {
                "idempotent_write_cpu_ratio": _pairs(load, count, pairs, create),
                "idempotent_read_cpu_ratio": _pairs(load, count, pairs, show),
            }
        finally:
            load.close()
    for figure, (ratio, with_us, without_us) in figures.items():
        run.record(figure, ratio, "python-http")
        run.note(f"{figure}.with_id_us_per_call", with_us)
        run.note(f"{figure}.without_id_us_per_call", without_us)
