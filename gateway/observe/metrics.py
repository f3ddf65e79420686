"""The server's Prometheus metrics, on a registry of its own (several servers in one process,
as in tests, never share counts).

Every label comes from a bounded set: operation names from the catalog, transports and
stream end reasons from fixed lists, ACP codes from the error table, plan phases and states
from the proto enums. Never an id, a path or anything a caller wrote.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.errors import TABLE

TRANSPORTS = ("local", "envelope", "rest", "grpc", "gateway")
CODES = ("OK", "CANCELLED", *TABLE)
CONTENT_TYPE = CONTENT_TYPE_LATEST

# Request latencies from 100 µs (a local call) to 30 s (plan.execute with wait).
DURATION_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
)
STORE_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)

# Sampled when scraped: (head sequence, plans counted by (phase, state)).
Sampler = Callable[[], Awaitable[tuple[int, Mapping[tuple[str, str], int]]]]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self.requests = Counter(
            "acp_requests",
            "ACP calls answered, by operation, transport and ACP code (OK for success).",
            ("operation", "transport", "code"),
            registry=self.registry,
        )
        self.duration = Histogram(
            "acp_request_duration_seconds",
            "Time to answer an ACP call (a stream: to admit it).",
            ("operation", "transport"),
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.subscribers = Gauge(
            "acp_event_stream_subscribers",
            "Open event streams, by transport.",
            ("transport",),
            registry=self.registry,
        )
        self.subscribers_ended = Counter(
            "acp_subscribers_ended",
            "Event streams ended, by reason (closed, too_slow, auth, shutdown, error).",
            ("reason",),
            registry=self.registry,
        )
        self.head_sequence = Gauge(
            "acp_event_log_head_sequence", "Sequence of the newest event in the log.", registry=self.registry
        )
        self.plans = Gauge(
            "acp_plans", "Plans by phase and state.", ("phase", "state"), registry=self.registry
        )
        self.store_commit = Histogram(
            "acp_store_commit_seconds",
            "Time a store commit took (one group commit: its transactions and the fsync).",
            buckets=STORE_BUCKETS,
            registry=self.registry,
        )
        self.store_wait = Histogram(
            "acp_store_wait_seconds",
            "Time a write waited for the store's writer before its commit began.",
            buckets=STORE_BUCKETS,
            registry=self.registry,
        )
        self._sampler: Sampler | None = None
        self._plan_labels: set[tuple[str, str]] = set()
        self._children: dict[tuple[str, str], tuple[Histogram, dict[str, Counter]]] = {}

    def child(self, operation: str, transport: str) -> tuple[Histogram, dict[str, Counter]]:
        """The histogram and per-code counters of one (operation, transport), resolved once:
        label lookups are the costly part of a Prometheus update."""
        key = (operation, transport)
        found = self._children.get(key)
        if found is None:
            if operation not in catalog.OPERATIONS or transport not in TRANSPORTS:
                raise ValueError(f"unbounded metric label {key!r}")
            found = (self.duration.labels(operation, transport), {})
            self._children[key] = found
        return found

    def count(self, operation: str, transport: str, code: str, seconds: float) -> None:
        histogram, counters = self.child(operation, transport)
        histogram.observe(seconds)
        counter = counters.get(code)
        if counter is None:
            counter = counters[code] = self.requests.labels(
                operation, transport, code if code in CODES else "INTERNAL_ERROR"
            )
        counter.inc()

    def sample_with(self, sampler: Sampler) -> None:
        self._sampler = sampler

    async def sample(self) -> None:
        """Refresh the gauges read from the store (called by the scrape, on the loop)."""
        if self._sampler is None:
            return
        head, plans = await self._sampler()
        self.head_sequence.set(head)
        seen = set(plans)
        for labels in self._plan_labels - seen:
            self.plans.labels(*labels).set(0)
        for labels, count in plans.items():
            self.plans.labels(*labels).set(count)
        self._plan_labels |= seen

    def render(self) -> bytes:
        return generate_latest(self.registry)
