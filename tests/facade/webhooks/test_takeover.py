"""One deliverer per subscription across replicas: two replica processes on one PostgreSQL
database, the one delivering killed with SIGKILL mid-stream; the other takes the
subscription over at once (its holder is a dead process of this kernel), nothing is
skipped, and what is delivered twice carries the same webhook-id."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.acp_client import ACPClient
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.store.base import Store
from tests import postgres
from tests.facade.webhooks.helpers import LOOPBACK_POLICY, event_log, log_events
from tests.facade.webhooks.receiver import Received, Receiver
from tests.server_process import Children

ROOT = pathlib.Path(__file__).resolve().parents[3]
EVENTS = 300


@pytest.fixture
def pg() -> Iterator[str]:
    with postgres.fresh_schema("webhooks") as url:
        yield url


def _replica(children: Children, url: str) -> int:
    process = children.popen(
        [sys.executable, "-m", "tests.facade.webhooks.replica", url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        env={**os.environ, "ACP_WEBHOOK_SCAN_SECONDS": "0.05", "ACP_WEBHOOK_RETRY_SCHEDULE": "0"},
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == b"ready"
    return process.pid


def _holder(store: Store, webhook_id: str) -> int:
    lease = store.get_lease(f"webhook:{webhook_id}")
    assert lease is not None
    return int(lease.owner.split("|")[2])


async def test_a_killed_deliverer_is_taken_over_without_a_gap(pg: str, children: Children) -> None:
    facade = open_facade(pg, policy=LOOPBACK_POLICY, deliver_webhooks=False)
    client = ACPClient(LocalTransport(facade))
    try:

        async def steady(_: Received) -> tuple[int, bytes, dict[str, str]]:
            await asyncio.sleep(0.005)
            return 200, b"", {}

        async with Receiver(steady) as receiver:
            added = await client.ops.webhook.add(name="replicated", url=receiver.url())
            pids = {
                await asyncio.to_thread(_replica, children, pg),
                await asyncio.to_thread(_replica, children, pg),
            }
            log = event_log(facade)
            appended = []
            for _ in range(EVENTS // 50):
                appended += await log.append(log_events(50))
            await receiver.wait_for(lambda: len(receiver.requests) >= EVENTS // 3)
            store = log.store
            first = await store.read(lambda s: _holder(s, added.webhook.meta.id))
            assert first in pids
            os.kill(first, signal.SIGKILL)
            killed_at = len(receiver.requests)
            assert killed_at < EVENTS
            await receiver.wait_for(
                lambda: len({r.headers["webhook-id"] for r in receiver.requests}) >= EVENTS, 60
            )
            second = await store.read(lambda s: _holder(s, added.webhook.meta.id))
            assert second == (pids - {first}).pop()
        ids = [r.headers["webhook-id"] for r in receiver.requests]
        first_seen = list(dict.fromkeys(ids))
        assert first_seen == [f"evt_{e.sequence}" for e in appended]
        # Resent after the kill: only what the killed replica had sent but not yet recorded,
        # from the cursor it had recorded on, in order, each with its event's id and body.
        sequences = [int(i.removeprefix("evt_")) for i in ids]
        drops = [j for j in range(1, len(sequences)) if sequences[j] <= sequences[j - 1]]
        assert len(drops) <= 1
        bodies: dict[str, bytes] = {}
        for got in receiver.requests:
            assert bodies.setdefault(got.headers["webhook-id"], got.body) == got.body
    finally:
        await client.close()
        await facade.close()
