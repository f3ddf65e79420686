"""A server drains as one (issue 30, item 6): on stop both wires stop taking calls at once
while the calls under way finish; a call still running when the grace period ends is cut and
answered, on HTTP with an envelope and on gRPC with a status carrying ErrorInfo, saying
whether it took effect (INVALID_STATE ``SERVER_STOPPING``, ``details.effect``).

The server runs in this test's loop; the call in flight is a ``plan.execute`` with ``wait``
whose model (the fake OpenAI server) holds its answer until the test lets it go.
"""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator

import httpx
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract.errors import ACPError, TransportError
from cleveragents.acp.contract.retry import RetryPolicy
from cleveragents.acp.facade.auth import TokenAuthenticator
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.gateway.observe.endpoints import READY
from cleveragents.acp.gateway.server import Server, ServerConfig
from cleveragents.acp.v1 import plan_pb2
from tests.conformance import logged
from tests.facade.plans.model_world import KEY, KEY_ENV
from tests.fake_openai import FakeOpenAI
from tests.gateway.test_abandoned_calls import Served, _held_plan, _tasks_beyond, _until
from tests.server_process import Tokens

HTTP_CALL = "RequestResponseCycle.run_asgi"


@pytest.fixture
async def served(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> AsyncIterator[Served]:
    """A served facade with a 1 s grace period (or the test's ``grace``); the test stops it."""
    grace = float(getattr(request, "param", 1.0))
    monkeypatch.setenv(KEY_ENV, KEY)
    tokens = Tokens.create(tmp_path)
    facade = open_facade(tmp_path / "acp.db", authenticator=TokenAuthenticator(tokens.path))
    config = ServerConfig(host="127.0.0.1", http_port=0, grpc_port=0, grace_seconds=grace)
    server = Server(config, facade=facade, observability=logged.observability())
    addresses = await server.start()
    assert addresses.grpc_target is not None
    client = ACPClient(GrpcTransport.connect(addresses.grpc_target, timeout=30), token=tokens.tokens["alice"])
    model = await FakeOpenAI().start()
    try:
        yield Served(
            server, addresses.http_url, addresses.grpc_target, tokens.tokens["alice"], client, tmp_path, model
        )
    finally:
        await client.close()
        await model.close()


def _http(served: Served) -> ACPClient:
    transport = HTTPTransport(
        httpx.AsyncClient(base_url=served.http_url, timeout=30), owns_client=True, retry=RetryPolicy.OFF
    )
    return ACPClient(transport, token=served.token)


# Long enough for the refused calls below to be tried on a loaded machine (nothing waits it out).
@pytest.mark.parametrize("served", [60.0], indirect=True)
async def test_both_wires_stop_taking_calls_at_once_and_calls_under_way_finish(served: Served) -> None:
    plan_id, release = await _held_plan(served)
    tasks = _tasks_beyond(set(asyncio.all_tasks()))
    async with _http(served) as client:
        call = asyncio.create_task(client.call("plan.execute", plan_id=plan_id, wait=True))
        await _until(lambda: HTTP_CALL in tasks().values(), tasks, "no task ran the call")
        stopping = asyncio.create_task(served.server.stop())
        await _until(lambda: served.server.observability.readiness.state != READY, tasks, "never drained")
        # A new call on either wire is refused while the HTTP call is still under way.
        fresh = GrpcTransport.connect(served.grpc_target, timeout=30, retry=RetryPolicy.OFF)
        async with ACPClient(fresh, token=served.token) as grpc_client:
            with pytest.raises(TransportError):
                await grpc_client.call("session.list")
        async with _http(served) as other:
            with pytest.raises(TransportError) as refused:
                await other.call("session.list")
        assert refused.value.details["sent"] is False
        assert not call.done()
        release.set()
        done = await call
    assert isinstance(done, plan_pb2.ExecutePlanResponse)
    await stopping


async def test_an_http_call_cut_at_the_end_of_the_grace_gets_an_envelope_saying_it_took_effect(
    served: Served,
) -> None:
    plan_id, release = await _held_plan(served)
    tasks = _tasks_beyond(set(asyncio.all_tasks()))
    body = {
        "acp_version": "1.1",
        "operation": "plan.execute",
        "request_id": "drain-http-1",
        "params": {"plan_id": plan_id, "wait": True},
    }
    headers = {"Authorization": f"Bearer {served.token}"}
    async with httpx.AsyncClient(base_url=served.http_url, timeout=30) as http:
        call = asyncio.create_task(http.post("/api/v1/acp", json=body, headers=headers))
        await _until(lambda: HTTP_CALL in tasks().values(), tasks, "no task ran the call")
        stopping = asyncio.create_task(served.server.stop())
        answer = await call
    release.set()
    await stopping
    assert answer.headers["content-type"] == "application/json", answer.text
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert error["code"] == "INVALID_STATE"
    assert error["details"]["refinement"] == "SERVER_STOPPING"
    # The execute had started the run (its request id's row is stored): not to be sent again.
    assert error["details"]["effect"] == "applied"
    assert error["details"]["retryable"] is False


async def test_a_grpc_call_cut_at_the_end_of_the_grace_gets_error_info_saying_it_took_effect(
    served: Served,
) -> None:
    plan_id, release = await _held_plan(served)
    tasks = _tasks_beyond(set(asyncio.all_tasks()))
    transport = GrpcTransport.connect(served.grpc_target, timeout=30, retry=RetryPolicy.OFF)
    async with ACPClient(transport, token=served.token) as client:
        call = asyncio.create_task(client.call("plan.execute", plan_id=plan_id, wait=True))
        await _until(lambda: "_schedule_rpc_coro" in tasks().values(), tasks, "no task ran the call")
        stopping = asyncio.create_task(served.server.stop())
        with pytest.raises(ACPError) as cut:
            await call
    release.set()
    await stopping
    assert not isinstance(cut.value, TransportError), cut.value
    assert (cut.value.code, cut.value.grpc_status) == ("INVALID_STATE", "FAILED_PRECONDITION")
    assert cut.value.details["refinement"] == "SERVER_STOPPING"
    assert cut.value.details["effect"] == "applied"
