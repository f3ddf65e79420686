"""Webhook deliveries (docs/webhooks.md), to a fast receiver on loopback.

- ``webhook_delivery_p99_ms``: from an event's commit (when the append that made it durable
  returns; a delivery that arrived first counts 0) to the receiver having read the request,
  p99, with events appended one at a time at ``RATE`` events/s. Goal: <= 20 ms. Beside it,
  in the details, the same from the event's own time, stamped before the commit began
  (``webhook_delivery_from_event_time_p99_ms``: the commit's fsync included).
- ``webhook_throughput_ratio``: deliveries/s one subscription makes from a backlog (the
  receiver answering at once) / ``RATE``, the write rate of the latency figure. Goal: >= 1:
  a subscription keeps up with that write rate, with room to catch up after an outage.

The delivering facade (a server's, on SQLite: ``open_facade(..., deliver_webhooks=True)``)
and the receiver (a bare asyncio HTTP/1.1 server) share this process and its loop, so the
figures include the receiver's work: conservative.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time

from bench.run import Run
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.acp_client import ACPClient
from cleveragents.acp.facade.domain.access.policy import Policy
from cleveragents.acp.facade.domain.events.log import EventLog
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import events_pb2

RATE = 200
_EVENTS = {"smoke": 60, "quick": 600, "full": 2000}
_BACKLOG = {"smoke": 100, "quick": 1000, "full": 3000}
_ANSWER = b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"


class _Receiver:
    """Keeps when each ``webhook-id`` first arrived (time.time())."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.changed = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/hook"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            fields = dict(
                line.split(":", 1) for line in head.decode("latin-1").split("\r\n")[1:] if ":" in line
            )
            lowered = {k.strip().lower(): v.strip() for k, v in fields.items()}
            await reader.readexactly(int(lowered.get("content-length", "0")))
            self.arrived.setdefault(lowered["webhook-id"], time.time())
            self.changed.set()
            writer.write(_ANSWER)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, KeyError):
            pass
        finally:
            writer.close()

    async def wait_for(self, count: int, seconds: float) -> None:
        async with asyncio.timeout(seconds):
            while len(self.arrived) < count:
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), 0.5)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


def _event(index: int, plan: str) -> events_pb2.Event:
    return events_pb2.Event(
        namespace="default", plan_id=plan, log_record=events_pb2.LogRecord(message=f"m{index}")
    )


def _log(facade: object) -> EventLog:
    for resource in getattr(facade, "_resources", ()):
        found = getattr(resource, "events", None)
        if isinstance(found, EventLog):
            return found
    raise RuntimeError("the facade has no event log")


async def _measure(run: Run) -> tuple[list[float], float]:
    policy = Policy.server(webhook_allow_http=True, webhook_allow_networks=["127.0.0.1/32"])
    facade = open_facade(run.scratch("webhooks") / "acp.db", policy=policy, deliver_webhooks=True)
    facade.start()
    client = ACPClient(LocalTransport(facade))
    latency_receiver, backlog_receiver = _Receiver(), _Receiver()
    try:
        log = _log(facade)
        await client.ops.webhook.add(
            name="latency", url=await latency_receiver.start(), filter={"plan_id": "latency"}
        )
        count = _EVENTS[run.mode.name]
        committed: dict[str, float] = {}
        stamped: dict[str, float] = {}
        started = time.perf_counter()
        for index in range(count):
            (event,) = await log.append([_event(index, "latency")])
            committed[f"evt_{event.sequence}"] = time.time()
            stamped[f"evt_{event.sequence}"] = event.time.ToNanoseconds() / 1e9
            await asyncio.sleep(max(0.0, started + (index + 1) / RATE - time.perf_counter()))
        await latency_receiver.wait_for(count, 60)
        latencies = [max(0.0, latency_receiver.arrived[i] - t) * 1000 for i, t in committed.items()]
        from_stamp = sorted((latency_receiver.arrived[i] - t) * 1000 for i, t in stamped.items())
        run.note("webhook_delivery_from_event_time_p99_ms", _p99(from_stamp))

        backlog = _BACKLOG[run.mode.name]
        appended = []
        for first in range(0, backlog, 100):
            appended += await log.append(
                [_event(i, "backlog") for i in range(first, min(first + 100, backlog))]
            )
        began = time.perf_counter()
        await client.ops.webhook.add(
            name="backlog",
            url=await backlog_receiver.start(),
            filter={"plan_id": "backlog"},
            cursor=appended[0].sequence - 1,
        )
        await backlog_receiver.wait_for(backlog, 120)
        rate = backlog / (time.perf_counter() - began)
    finally:
        await client.close()
        await facade.close()
        await latency_receiver.close()
        await backlog_receiver.close()
    return latencies, rate


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def run_all(run: Run) -> None:
    latencies, rate = asyncio.run(_measure(run))
    run.record("webhook_delivery_p99_ms", _p99(latencies), "python-asyncio")
    run.record("webhook_throughput_ratio", rate / RATE, "python-asyncio")
    run.note("webhook_delivery_p50_ms", statistics.median(latencies))
    run.note("webhook_deliveries_per_s", rate)
    run.note("webhook_write_rate_per_s", RATE)
