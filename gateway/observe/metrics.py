"""The server's Prometheus metrics, on a registry of its own (several servers in one process,
as in tests, never share counts).

Every label comes from a bounded set: operation names from the catalog, transports and
stream end reasons from fixed lists, ACP codes from the error table, plan phases and states
from the proto enums. Never an id, a path or anything a caller wrote.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Awaitable, Callable, Iterable, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

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
STORE_ACCESS = ("read", "write")
STORE_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)

# Sampled when scraped: (head sequence, plans counted by (phase, state)).
Sampler = Callable[[], Awaitable[tuple[int, Mapping[tuple[str, str], int]]]]


class _Series:
    """Counts of one (operation, transport): kept by the event loop's thread only, so no lock;
    a Prometheus child per update costs a lock and a label lookup, a tenth of a call."""

    __slots__ = ("buckets", "codes", "count", "total")

    def __init__(self) -> None:
        self.buckets = [0] * (len(DURATION_BUCKETS) + 1)
        self.codes: dict[str, int] = {}
        self.count = 0
        self.total = 0.0


# (operation, transport), codes, cumulative bucket counts and sum, as of the last scrape.
Snapshot = list[tuple[tuple[str, str], dict[str, int], list[int], float]]


class _CallCollector(Collector):
    """Exposes the snapshot ``Metrics.sample`` took on the loop."""

    def __init__(self) -> None:
        self.snapshot: Snapshot = []

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        requests = CounterMetricFamily(
            "acp_requests",
            "ACP calls answered, by operation, transport and ACP code (OK for success).",
            labels=("operation", "transport", "code"),
        )
        duration = HistogramMetricFamily(
            "acp_request_duration_seconds",
            "Time to answer an ACP call (a stream: to admit it).",
            labels=("operation", "transport"),
        )
        bounds = [*(repr(float(b)) for b in DURATION_BUCKETS), "+Inf"]
        for (operation, transport), codes, cumulative, total in self.snapshot:
            for code, n in codes.items():
                requests.add_metric([operation, transport, code], n)
            duration.add_metric([operation, transport], list(zip(bounds, cumulative, strict=True)), total)
        return [requests, duration]


class _ReadCacheCollector(Collector):
    """The store's counts of reads answered from memory or not, read when scraped."""

    def __init__(self) -> None:
        self.counts: Callable[[], tuple[int, int]] | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "acp_store_read_cache",
            "Point reads (session.show, a registry's show) answered from memory because nobody "
            "committed since they were read (hit), or read from the database (miss).",
            labels=("result",),
        )
        hits, misses = self.counts() if self.counts is not None else (0, 0)
        family.add_metric(["hit"], hits)
        family.add_metric(["miss"], misses)
        return [family]


WEBHOOK_RESULTS = ("succeeded", "failed", "refused", "gone")
# Commit of an event to its receiver's 2xx, from 1 ms to a minute (retries included).
WEBHOOK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 5, 30, 60)
# (attempts by result, backlog by (namespace, name)) of this process's deliverer.
WebhookCounts = Callable[[], tuple[Mapping[str, int], Mapping[tuple[str, str], int]]]


class _WebhookCollector(Collector):
    """This process's webhook deliveries, read when scraped. The backlog is labelled by the
    subscription's namespace and name: registry-like entries a writer made, not per-call
    values (an id, a path), so their number is the number of subscriptions."""

    def __init__(self) -> None:
        self.counts: WebhookCounts | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        deliveries = CounterMetricFamily(
            "acp_webhook_deliveries",
            "Webhook delivery attempts made by this process, by result (succeeded: 2xx; failed: "
            "any other answer or none; refused: the address checks; gone: 410, which disables).",
            labels=("result",),
        )
        backlog = GaugeMetricFamily(
            "acp_webhook_backlog",
            "Events after the cursor of each subscription this process delivers (an upper bound "
            "on what it still owes: the filter may skip some).",
            labels=("namespace", "webhook"),
        )
        results, backlogs = self.counts() if self.counts is not None else ({}, {})
        for result in WEBHOOK_RESULTS:
            deliveries.add_metric([result], results.get(result, 0))
        for (namespace, name), number in sorted(backlogs.items()):
            backlog.add_metric([namespace, name], number)
        return [deliveries, backlog]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self._calls = _CallCollector()
        self.registry.register(self._calls)
        self._read_cache = _ReadCacheCollector()
        self.registry.register(self._read_cache)
        self._webhooks = _WebhookCollector()
        self.registry.register(self._webhooks)
        self.webhook_latency = Histogram(
            "acp_webhook_delivery_latency_seconds",
            "From an event's commit to its receiver's 2xx answer, retries included.",
            buckets=WEBHOOK_BUCKETS,
            registry=self.registry,
        )
        self._series: dict[tuple[str, str], _Series] = {}
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
            "Time a store read waited for a reader thread, or a write for the writer thread and "
            "the write lock, before it ran.",
            ("access",),
            buckets=STORE_BUCKETS,
            registry=self.registry,
        )
        self._store_wait = {access: self.store_wait.labels(access) for access in STORE_ACCESS}
        self._sampler: Sampler | None = None
        self._plan_labels: set[tuple[str, str]] = set()

    def count(self, operation: str, transport: str, code: str, seconds: float) -> None:
        """One answered call (on the event loop's thread)."""
        key = (operation, transport)
        series = self._series.get(key)
        if series is None:
            # Any major's operation (an operation only ACP 2 has was refused as unbounded).
            known = any(operation in major.operations for major in catalog.CATALOG.majors.values())
            if not known or transport not in TRANSPORTS:
                raise ValueError(f"unbounded metric label {key!r}")
            series = self._series[key] = _Series()
        series.buckets[bisect.bisect_left(DURATION_BUCKETS, seconds)] += 1
        series.count += 1
        series.total += seconds
        if code not in CODES:
            code = "INTERNAL_ERROR"
        series.codes[code] = series.codes.get(code, 0) + 1

    # the store's observer (facade.store.base.StoreObserver), called from its threads ---

    def committed(self, seconds: float) -> None:
        self.store_commit.observe(seconds)

    def waited(self, access: str, seconds: float) -> None:
        series = self._store_wait.get(access)
        if series is None:
            raise ValueError(f"unbounded metric label access={access!r}")
        series.observe(seconds)

    def count_cached_reads_with(self, counts: Callable[[], tuple[int, int]]) -> None:
        """``counts``: the store's (hits, misses), two ints read from any thread."""
        self._read_cache.counts = counts

    def count_webhooks_with(self, counts: WebhookCounts) -> None:
        self._webhooks.counts = counts

    def webhook_delivered(self, seconds: float) -> None:
        """One accepted webhook delivery, ``seconds`` after its event's commit (on the loop)."""
        self.webhook_latency.observe(seconds)

    def sample_with(self, sampler: Sampler) -> None:
        self._sampler = sampler

    async def sample(self) -> None:
        """On the loop, before a scrape renders: copy the call counts, and refresh the gauges
        read from the store."""
        snapshot: Snapshot = []
        for key, series in list(self._series.items()):
            cumulative = list(itertools.accumulate(series.buckets))
            snapshot.append((key, dict(series.codes), cumulative, series.total))
        self._calls.snapshot = snapshot
        if self._sampler is None:
            return
        head, plans = await self._sampler()
        self.head_sequence.set(head)
        seen = set(plans)
        for labels in self._plan_labels - seen:
            self.plans.labels(*labels).set(0)
        for labels, number in plans.items():
            self.plans.labels(*labels).set(number)
        self._plan_labels |= seen

    def render(self) -> bytes:
        return generate_latest(self.registry)
