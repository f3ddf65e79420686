"""How long and how big each measurement is, per run mode.

Every loop of the benchmark is bounded by these numbers (a duration, a count, or both).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mode:
    name: str
    # One throughput measurement under load (wrk/h2load/Python generators).
    load_seconds: float
    # Unmeasured load before it, so the server's caches and JITs-of-sorts are warm.
    warmup_seconds: float
    # Each load and stream measurement is repeated, baseline and product in turn, and the
    # best of each kept: other work on a shared machine only ever slows a run down.
    repeats: int
    # Local figures: per-call timing and the plan flow loop.
    local_seconds: float
    # Events published for the publish -> receive latency.
    latency_events: int
    # Backlog replayed by each SSE subscriber.
    sse_events: int
    fanout_events: int
    fanout_subscribers: int
    # Upper bound of any single streaming measurement.
    stream_timeout: float
    # The memory figure's population.
    sessions: int
    plans: int


FULL = Mode(
    name="full",
    load_seconds=5,
    warmup_seconds=2,
    repeats=3,
    local_seconds=6,
    latency_events=5000,
    sse_events=30_000,
    fanout_events=1000,
    fanout_subscribers=100,
    stream_timeout=90,
    sessions=10_000,
    plans=1_000,
)

QUICK = Mode(
    name="quick",
    load_seconds=3,
    warmup_seconds=1,
    repeats=2,
    local_seconds=2,
    latency_events=1500,
    sse_events=10_000,
    fanout_events=300,
    fanout_subscribers=100,
    stream_timeout=30,
    sessions=10_000,
    plans=1_000,
)

# Proves the benchmark code runs (tests run it); its figures mean little.
SMOKE = Mode(
    name="smoke",
    load_seconds=1,
    warmup_seconds=0,
    repeats=1,
    local_seconds=0.3,
    latency_events=100,
    sse_events=300,
    fanout_events=30,
    fanout_subscribers=10,
    stream_timeout=15,
    sessions=100,
    plans=5,
)

MODES = {mode.name: mode for mode in (FULL, QUICK, SMOKE)}
