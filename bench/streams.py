"""Stream figures: events delivered over SSE, against a raw Starlette StreamingResponse.

The server's event log is filled before it starts; subscribers then read it from
``after_sequence`` 0, so what is measured is delivery (store read, JSON, SSE framing,
sending), not publishing, and no subscriber can fall behind and be ended.

- ``sse_single_ratio``: events/s to one subscriber / the raw endpoint's, same frames.
- ``sse_fanout_ratio``: total events/s to many concurrent subscribers, spread over several
  client processes / the raw endpoint's to as many; ``sse_fanout_events_per_s`` is the
  product's rate itself. The raw endpoint encodes nothing, but frames every event for every
  subscriber, while the product encodes an event once for all of them: above 1 is possible.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

from bench import baselines
from bench.load import RESULT
from bench.procs import CPUMeter, ServerProcess, python_module
from bench.product import Product
from bench.run import Run
from cleveragents.acp.contract import catalog, sse
from cleveragents.acp.facade.factory import open_event_log
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import events_pb2, plan_pb2

CLIENT_PROCESSES = 4
PUBLISH_BATCH = 1000


def _event(index: int) -> events_pb2.Event:
    return events_pb2.Event(
        namespace="default",
        plan_id=f"01JBENCHPLAN{index % 97:014d}",
        session_id="01JBENCHSESSION00000000000",
        plan_state_changed=events_pb2.PlanStateChanged(
            phase=plan_pb2.PLAN_PHASE_EXECUTE,
            from_state=plan_pb2.PLAN_STATE_PENDING,
            to_state=plan_pb2.PLAN_STATE_RUNNING,
            reason="the executor picked it up",
        ),
    )


def fill_log(db: pathlib.Path, count: int) -> bytes:
    """``count`` events in a fresh store; returns one's SSE frame without its id line."""
    store = SQLiteStore(db)
    log = open_event_log(store)
    try:
        published: list[events_pb2.Event] = []
        for start in range(0, count, PUBLISH_BATCH):
            batch = [_event(i) for i in range(start, min(count, start + PUBLISH_BATCH))]
            published = log.publish_many(batch)
    finally:
        log.close()
        store.close()
    op = catalog.OPERATIONS["events.subscribe"]
    frame = sse.frame(op, events_pb2.SubscribeEventsResponse(event=published[-1]))
    return frame.split(b"\n", 1)[1]


def subscribe(
    url: str, headers: Mapping[str, str], connections: int, events: int, timeout: float
) -> list[dict[str, Any]]:
    """``connections`` subscribers over up to CLIENT_PROCESSES processes."""
    processes = min(CLIENT_PROCESSES, connections)
    procs = []
    for index in range(processes):
        share = connections // processes + (1 if index < connections % processes else 0)
        spec = {"url": url, "headers": dict(headers), "connections": share, "events": events}
        spec["timeout"] = timeout
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "bench.sse_client", json.dumps(spec)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    found: list[dict[str, Any]] = []
    for proc in procs:
        out, err = proc.communicate(timeout=timeout + 60)
        lines = [line for line in out.splitlines() if line.startswith(RESULT)]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"SSE client failed: {err[-3000:]}")
        found += json.loads(lines[0][len(RESULT) :])
    return found


def _rate(streams: list[dict[str, Any]], wanted: int) -> tuple[float, int]:
    """Events per second over the whole window, and how many streams fell short."""
    total = sum(s["events"] for s in streams)
    window = max(s["ended"] for s in streams) - min(s["started"] for s in streams)
    short = sum(1 for s in streams if s["events"] < wanted or s["status"] != 200)
    return (total / window if window > 0 else 0.0), short


def _measure(
    run: Run, server: ServerProcess, url: str, headers: Mapping[str, str], connections: int, events: int
) -> tuple[float, float, int]:
    """Events/s, the server's CPU µs per event, and how many streams fell short."""
    meter = CPUMeter(server)
    meter.start()
    streams = subscribe(url, headers, connections, events, run.mode.stream_timeout)
    meter.stop()
    rate, short = _rate(streams, events)
    return rate, meter.us_per(sum(s["events"] for s in streams)), short


Stream = tuple[ServerProcess, str, Mapping[str, str], int, int]


def _best(run: Run, entries: dict[str, Stream], repeats: int) -> dict[str, float]:
    """Each stream measurement in turn, ``repeats`` times; the best rate of each."""
    best: dict[str, float] = {}
    for _ in range(repeats):
        for name, (server, url, headers, connections, events) in entries.items():
            rate, cpu_us, short = _measure(run, server, url, headers, connections, events)
            if short:
                run.note(f"{name}_incomplete_streams", short)
            if rate > best.get(name, -1.0):
                best[name] = rate
                run.note(f"{name}_cpu_us", cpu_us)
    return best


def run_all(run: Run) -> None:
    folder = run.scratch("streams")
    count = max(run.mode.sse_events, run.mode.fanout_events)
    frame_file = folder / "frame.txt"
    frame_file.write_bytes(fill_log(folder / "acp.db", count))
    mode = run.mode
    subscribers = mode.fanout_subscribers
    with (
        ServerProcess(
            python_module("bench.baselines", "sse", "--frame", str(frame_file)),
            ready_prefix=baselines.READY,
            log=run.scratch("logs") / "sse-raw.log",
        ) as raw,
        Product(folder, db=folder / "acp.db") as product,
    ):
        base = f"http://127.0.0.1:{raw.info['port']}/stream"
        url = f"{product.http_url}/api/v1/events/stream"
        auth = product.auth_header
        single = _best(
            run,
            {
                "raw_sse": (raw, f"{base}?n={mode.sse_events}", {}, 1, mode.sse_events),
                "sse_single": (product.server, url, auth, 1, mode.sse_events),
            },
            mode.repeats,
        )
        fanout = _best(
            run,
            {
                "raw_sse_fanout": (
                    raw,
                    f"{base}?n={mode.fanout_events}",
                    {},
                    subscribers,
                    mode.fanout_events,
                ),
                "sse_fanout": (product.server, url, auth, subscribers, mode.fanout_events),
            },
            max(1, mode.repeats - 1),
        )
    run.note("raw_sse_events_per_s", single["raw_sse"])
    run.note("raw_sse_fanout_events_per_s", fanout["raw_sse_fanout"])
    run.note("sse_single_events_per_s", single["sse_single"])
    run.note("sse_fanout_subscribers", subscribers)
    run.record("sse_single_ratio", single["sse_single"] / single["raw_sse"], "python-sse")
    run.record("sse_fanout_ratio", fanout["sse_fanout"] / fanout["raw_sse_fanout"], "python-sse")
    run.record("sse_fanout_events_per_s", fanout["sse_fanout"], "python-sse")
