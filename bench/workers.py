"""``agents serve --workers 2`` (issue 19 item 5), measured in the same run as one worker.

- ``cross_worker_event_latency_p99_ms``: an event committed by one worker (``session.tell``
  over fresh connections, which the kernel spreads over the workers) -> its SSE frame read by
  a subscriber of the *other* worker, counted from the frame of the committing worker's own
  subscriber: that one leaves on the fast path right after the commit is durable, so the
  difference is what crossing costs (the wake-up datagram, the follower's read, the frame),
  not the fsync both share. Each worker has a subscriber (placed by opening streams until each
  worker's own metrics listener counts one); per event the earlier arrival is the committing
  worker's. Beside it, from the event's own time stamp (taken on the writer thread before the
  commit; one host, one clock): the same worker's and the other's absolute latencies.
- ``workers_cpu_per_request_ratio``: server CPU per ``session.show`` envelope request (user
  plus system time from /proc/<pid>/stat of the parent and every worker, summed) with 2
  workers / with 1, same load (16 connections). Both servers run at once; their loads
  alternate in rounds (ABBA) and the figure is the median of the rounds' ratios. On a 2-core
  machine a second worker cannot show more throughput; that it costs no more CPU per request
  is what this checks. docs/benchmarks.md says how to measure scaling on more cores.

  It used to be the lowest CPU per request of each server's repeats, one server measured
  after the other (issue 35 item 5 read +22-28 % by hand where it said 0.95): the same CPU, but
  each side's least disturbed moment, not the same moment. That estimate stays in the
  details (``workers_cpu_per_request_ratio_lowest``), with the busier worker's share of the
  two workers' CPU (``two_workers_busier_share``: the kernel's spread of the connections).
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import threading
import time

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from bench import load, unary
from bench.procs import ServerProcess
from bench.product import Product
from bench.replicas import _event_time, _percentile, _subscribe
from bench.run import Run

TELLS = {"smoke": 10, "quick": 60, "full": 150}
# Streams opened at most to get one on each worker (each lands on a given one with p = 1/2).
MAX_STREAMS = 40


def run_all(run: Run) -> None:
    folder = run.scratch("workers")
    metrics_port = _free_port_pair()
    with Product(folder / "two", extra=["--workers", "2", "--metrics-port", str(metrics_port)]) as two:
        other, same, crossing = _cross_latencies(two, metrics_port, TELLS.get(run.mode.name, 60))
        with Product(folder / "one") as one:
            rounds = unary.alternated(run, {"one": _show_load(run, one), "two": _show_load(run, two)})
    run.note("cross_worker_event_latency_p50_ms", _percentile(crossing, 0.5))
    run.note("cross_worker_event_latency_events", len(crossing))
    run.note("other_worker_stamp_to_frame_p50_ms", _percentile(other, 0.5))
    run.note("other_worker_stamp_to_frame_p99_ms", _percentile(other, 0.99))
    run.note("same_worker_stamp_to_frame_p50_ms", _percentile(same, 0.5))
    run.note("same_worker_stamp_to_frame_p99_ms", _percentile(same, 0.99))
    run.record("cross_worker_event_latency_p99_ms", _percentile(crossing, 0.99), "sse")
    ones, twos = rounds["one"], rounds["two"]
    ratios = [b.cpu_us / a.cpu_us for a, b in zip(ones, twos, strict=True)]
    run.note("workers_cpu_per_request_ratio_rounds", ratios)
    run.note("one_worker_envelope_cpu_us", statistics.median(m.cpu_us for m in ones))
    run.note("two_workers_envelope_cpu_us", statistics.median(m.cpu_us for m in twos))
    run.note("one_worker_envelope_rps", statistics.median(m.result.rps for m in ones))
    run.note("two_workers_envelope_rps", statistics.median(m.result.rps for m in twos))
    # Of the workers' CPU (the parent's share comes first): 0.5 is an even spread, 1.0 one idle.
    run.note(
        "two_workers_busier_share",
        statistics.median(max(m.shares[1:]) / (sum(m.shares[1:]) or 1.0) for m in twos),
    )
    run.note(
        "workers_cpu_per_request_ratio_lowest",
        min(m.cpu_us for m in twos) / min(m.cpu_us for m in ones),
    )
    run.record("workers_cpu_per_request_ratio", statistics.median(ratios), ones[0].result.generator)


def _free_port_pair() -> int:
    """A port P with P+1 free too: the two workers' metrics listeners."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = int(first.getsockname()[1])
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
                return port
    raise RuntimeError("no two consecutive free ports")


def _subscribers(port: int) -> list[float]:
    counts = []
    for index in range(2):
        text = httpx.get(f"http://127.0.0.1:{port + index}/metrics", timeout=10).text
        counts.append(
            sum(
                sample.value
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.name == "acp_event_stream_subscribers"
            )
        )
    return counts


def _cross_latencies(product: Product, port: int, tells: int) -> tuple[list[float], list[float], list[float]]:
    """Sorted milliseconds, per event: from its time stamp to its frame at the other worker's
    subscriber, the same at the committing worker's, and the difference of the two."""
    with httpx.Client(
        base_url=product.http_url,
        headers=product.auth_header,
        timeout=30,
        limits=httpx.Limits(max_keepalive_connections=0),
    ) as client:
        created = client.post(
            "/api/v1/acp", content=orjson.dumps({"operation": "session.create", "params": {"title": "w"}})
        )
        session_id = created.raise_for_status().json()["data"]["session"]["meta"]["id"]
        placed: dict[int, list[tuple[float, bytes]]] = {}
        for _ in range(MAX_STREAMS):
            before = _subscribers(port)
            arrivals: list[tuple[float, bytes]] = []
            ready = threading.Event()
            threading.Thread(
                target=_subscribe, args=(product, session_id, arrivals, ready), daemon=True
            ).start()
            if not ready.wait(30):
                raise RuntimeError("a subscriber never opened its stream")
            deadline = time.monotonic() + 10
            while (after := _subscribers(port)) == before and time.monotonic() < deadline:
                time.sleep(0.05)
            worker = 0 if after[0] > before[0] else 1
            placed.setdefault(worker, arrivals)
            if len(placed) == 2:
                break
        if len(placed) != 2:
            raise RuntimeError(f"every stream of {MAX_STREAMS} landed on one worker")
        for index in range(tells):
            body = {"operation": "session.tell", "params": {"session_id": session_id, "content": f"m{index}"}}
            client.post("/api/v1/acp", content=orjson.dumps(body)).raise_for_status()
            # Paced: a latency, not a queue under load.
            time.sleep(0.005)
    # Each tell commits its message and the orchestrator's answer.
    deadline = time.monotonic() + 60
    while min(len(placed[0]), len(placed[1])) < 2 * tells:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the subscribers got {len(placed[0])} and {len(placed[1])} events")
        time.sleep(0.1)
    by_sequence: dict[str, list[float]] = {}
    for arrivals in placed.values():
        for arrived, data in list(arrivals):
            event = orjson.loads(data)
            by_sequence.setdefault(event["sequence"], []).append((arrived - _event_time(data)) * 1000)
    pairs = [sorted(latencies) for latencies in by_sequence.values() if len(latencies) == 2]
    return (
        sorted(pair[1] for pair in pairs),
        sorted(pair[0] for pair in pairs),
        sorted(pair[1] - pair[0] for pair in pairs),
    )


def _show_load(run: Run, product: Product) -> tuple[ServerProcess, unary.Generator]:
    """``session.show`` of a session of its own over the envelope, 16 connections."""
    session_id, _ = asyncio.run(unary.seed_session(product))
    body = orjson.dumps({"operation": "session.show", "params": {"session_id": session_id}})
    url = f"{product.http_url}/api/v1/acp"

    def generate(seconds: float) -> load.LoadResult:
        return load.http_load(
            url,
            body=body,
            headers=product.auth_header,
            connections=unary.IN_FLIGHT,
            seconds=seconds,
            prefer=run.prefer,
        )

    return product.server, generate
