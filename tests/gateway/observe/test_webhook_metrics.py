"""Webhook figures in /metrics (issue 37): ``acp_webhook_deliveries_total{result}``,
``acp_webhook_delivery_latency_seconds`` and ``acp_webhook_backlog{namespace,name}``, counted
exactly for deliveries to real receivers on loopback, subscriptions added over HTTP."""

from __future__ import annotations

import asyncio
import pathlib

import httpx
import pytest

from cleveragents.acp.facade import auth
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.gateway.server import Server, ServerConfig
from tests.facade.webhooks.helpers import LOOPBACK_POLICY, event_log, fast_retries, log_events
from tests.facade.webhooks.receiver import Receiver
from tests.gateway.observe.test_metrics import scrape, value


async def test_deliveries_latency_and_backlog(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast_retries(monkeypatch)
    tokens = tmp_path / "tokens.toml"
    token = auth.create_token(tokens, "alice", ["default"])
    facade = open_facade(
        tmp_path / "acp.db",
        authenticator=auth.TokenAuthenticator(tokens),
        policy=LOOPBACK_POLICY,
        deliver_webhooks=True,
    )
    server = Server(ServerConfig(http_port=0, grpc_port=0, grace_seconds=2, metrics_port=0), facade=facade)
    await server.start()
    try:
        assert server.addresses is not None
        assert server.metrics_url is not None
        http = server.addresses.http_url
        async with (
            Receiver() as fine,
            Receiver(lambda _: (410, b"", {})) as gone,
            httpx.AsyncClient(timeout=10) as client,
        ):
            for name, receiver in (("fine", fine), ("gone", gone)):
                added = await client.post(
                    f"{http}/api/v1/acp",
                    json={
                        "operation": "webhook.add",
                        "params": {
                            "name": name,
                            "url": receiver.url(),
                            "filter": {"event_type": ["log.record"]},
                        },
                    },
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert added.status_code == 200, added.text
            await event_log(facade).append(log_events(3))
            await fine.wait_for(lambda: len(fine.requests) == 3)
            await gone.wait_for(lambda: len(gone.requests) == 1)
            async with asyncio.timeout(10):
                while True:
                    found = await scrape(client, server.metrics_url)
                    if ("acp_webhook_backlog", (("namespace", "default"), ("webhook", "fine"))) in found:
                        break
                    await asyncio.sleep(0.05)
        assert value(found, "acp_webhook_deliveries_total", result="succeeded") == 3
        assert value(found, "acp_webhook_deliveries_total", result="gone") == 1
        assert value(found, "acp_webhook_deliveries_total", result="failed") == 0
        assert value(found, "acp_webhook_delivery_latency_seconds_count") == 3
        assert value(found, "acp_webhook_backlog", namespace="default", webhook="fine") == 0
    finally:
        await server.stop()
