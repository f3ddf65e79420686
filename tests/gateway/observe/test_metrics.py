"""/metrics on a real server: exact counts of a scenario over the envelope, REST and gRPC,
subscribers of open streams, who may scrape, and ``--metrics-port``; /readyz and gRPC health
through a drain."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.contract.transport import CallOptions
from cleveragents.acp.facade import auth
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.gateway.server import Server, ServerConfig
from cleveragents.acp.v1 import meta_pb2, session_pb2

WAIT = 10.0


class Running:
    def __init__(self, server: Server, token: str) -> None:
        self.server = server
        self.token = token
        assert server.addresses is not None
        self.http = server.addresses.http_url
        self.grpc = server.addresses.grpc_target or ""


@pytest.fixture
async def running(tmp_path: pathlib.Path) -> AsyncIterator[Running]:
    tokens = tmp_path / "tokens.toml"
    token = auth.create_token(tokens, "alice", ["default"])
    facade = open_facade(tmp_path / "acp.db", authenticator=auth.TokenAuthenticator(tokens))
    config = ServerConfig(http_port=0, grpc_port=0, grace_seconds=2, metrics_port=0)
    server = Server(config, facade=facade)
    await server.start()
    try:
        yield Running(server, token)
    finally:
        await server.stop()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return found.get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape(client: httpx.AsyncClient, url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = await client.get(url)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return samples(response.text)


async def envelope(client: httpx.AsyncClient, url: str, token: str, operation: str, **params: object) -> int:
    return (await call(client, url, token, operation, **params)).status_code


async def call(
    client: httpx.AsyncClient, url: str, token: str, operation: str, **params: object
) -> httpx.Response:
    return await client.post(
        f"{url}/api/v1/acp",
        json={"operation": operation, "params": params},
        headers={"Authorization": f"Bearer {token}"},
    )


async def test_a_scenario_counts_exactly(running: Running) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as client:
        for _ in range(2):
            assert await envelope(client, running.http, running.token, "session.create") == 200
        created = await call(client, running.http, running.token, "session.create")
        session_id = created.json()["data"]["session"]["meta"]["id"]
        told = await call(
            client, running.http, running.token, "session.tell", session_id=session_id, content="hi"
        )
        assert told.status_code == 200
        assert await envelope(client, running.http, running.token, "session.show", session_id="nope") == 404
        assert await envelope(client, running.http, "not-a-token", "session.list") == 401
        response = await client.get(
            f"{running.http}/api/v1/sessions", headers={"Authorization": f"Bearer {running.token}"}
        )
        assert response.status_code == 200
        grpc_transport = GrpcTransport.connect(running.grpc)
        try:
            options = CallOptions(acp_version=None, token=running.token, request_id="r-1")
            await grpc_transport.call(
                catalog.OPERATIONS["meta.version"], meta_pb2.GetVersionRequest(), options
            )
            with pytest.raises(ACPError):
                await grpc_transport.call(
                    catalog.OPERATIONS["session.show"],
                    session_pb2.GetSessionRequest(session_id="nope"),
                    options,
                )
        finally:
            await grpc_transport.close()
        found = await scrape(client, f"{running.http}/metrics")
    total = "acp_requests_total"
    assert value(found, total, operation="session.create", transport="envelope", code="OK") == 3
    assert value(found, total, operation="session.show", transport="envelope", code="NOT_FOUND") == 1
    assert value(found, total, operation="session.list", transport="envelope", code="AUTH_REQUIRED") == 1
    assert value(found, total, operation="session.list", transport="rest", code="OK") == 1
    assert value(found, total, operation="meta.version", transport="grpc", code="OK") == 1
    assert value(found, total, operation="session.show", transport="grpc", code="NOT_FOUND") == 1
    assert value(found, total, operation="session.tell", transport="envelope", code="OK") == 1
    counted = sum(v for (name, _), v in found.items() if name == total)
    assert counted == 9
    histogram = "acp_request_duration_seconds_count"
    assert value(found, histogram, operation="session.create", transport="envelope") == 3
    assert value(found, "acp_event_log_head_sequence") >= 1
    assert any(name == "process_resident_memory_bytes" for name, _ in found)
    for name, labels in found:
        for key, label in labels:
            assert "nope" not in label, (name, key)
            assert running.token not in label, (name, key)


async def test_open_streams_are_counted_and_their_end_has_a_reason(running: Running) -> None:
    url = f"{running.http}/api/v1/events/stream"
    async with httpx.AsyncClient(timeout=WAIT) as client:
        async with client.stream(
            "GET", url, headers={"Authorization": f"Bearer {running.token}"}
        ) as response:
            assert response.status_code == 200
            for _ in range(int(WAIT / 0.05)):
                found = await scrape(client, f"{running.http}/metrics")
                if value(found, "acp_event_stream_subscribers", transport="rest") == 1:
                    break
                await asyncio.sleep(0.05)
            assert value(found, "acp_event_stream_subscribers", transport="rest") == 1
        for _ in range(int(WAIT / 0.05)):
            found = await scrape(client, f"{running.http}/metrics")
            if value(found, "acp_subscribers_ended_total", reason="closed") == 1:
                break
            await asyncio.sleep(0.05)
    assert value(found, "acp_event_stream_subscribers", transport="rest") == 0
    assert value(found, "acp_subscribers_ended_total", reason="closed") == 1


async def test_only_loopback_scrapes_the_gateway_port_and_the_metrics_port_serves_anyone(
    running: Running,
) -> None:
    app = running.server.app
    assert app is not None
    far = httpx.ASGITransport(app=app, client=("10.1.2.3", 4567))
    async with httpx.AsyncClient(transport=far, base_url="http://acp") as client:
        refused = await client.get("/metrics")
    assert refused.status_code == 403
    error = refused.json()["error"]
    assert error["code"] == "AUTH_FORBIDDEN"
    assert "--metrics-port" in error["message"]
    assert running.server.metrics_url is not None
    async with httpx.AsyncClient(timeout=WAIT) as client:
        found = await scrape(client, running.server.metrics_url)
    assert any(name == "acp_requests_total" or name == "process_cpu_seconds_total" for name, _ in found)


async def test_readiness_turns_off_before_the_drain(running: Running) -> None:
    async with httpx.AsyncClient(timeout=WAIT) as client:
        ready = await client.get(f"{running.http}/readyz")
        assert ready.status_code == 200
        assert ready.json()["data"] == {"status": "ready"}
        async with grpc.aio.insecure_channel(running.grpc) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            answer = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            await running.server.observability.readiness.drain()
            answer = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
        draining = await client.get(f"{running.http}/readyz")
        assert draining.status_code == 503
        assert draining.json()["error"]["details"]["status"] == "draining"
        alive = await client.get(f"{running.http}/healthz")
        assert alive.status_code == 200


async def test_an_unreachable_store_is_not_ready(tmp_path: pathlib.Path) -> None:
    facade = open_facade(tmp_path / "acp.db")

    async def broken() -> None:
        raise OSError("disk gone")

    server = Server(ServerConfig(http_port=0, grpc_port=None), facade=facade)
    server.observability.readiness.probe_with(broken)
    await server.start()
    try:
        assert server.addresses is not None
        async with httpx.AsyncClient(timeout=WAIT) as client:
            answer = await client.get(f"{server.addresses.http_url}/readyz")
        assert answer.status_code == 503
        assert answer.json()["error"]["details"]["status"] == "store_unreachable"
    finally:
        await server.stop()
