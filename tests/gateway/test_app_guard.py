"""The ASGI layers around the gateway endpoint: an envelope for anything raised before a
response started, WebSockets refused, lifespan acknowledged (in process, real facade)."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from starlette.types import Message, Receive, Scope, Send

from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.gateway.http.app import GatewayApp, build_app
from cleveragents.acp.gateway.http.application import EnvelopeGuard


@pytest.fixture
async def app(tmp_path: pathlib.Path) -> AsyncIterator[GatewayApp]:
    facade = open_facade(tmp_path / "acp.db")
    yield build_app(facade)
    await facade.close()


def http_scope(path: str = "/healthz") -> Scope:
    return {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [],
    }


async def call(app: Any, scope: Scope, incoming: list[Message] | None = None) -> list[Message]:
    pending = list(incoming or [{"type": "http.request", "body": b"", "more_body": False}])
    sent: list[Message] = []

    async def receive() -> Message:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(scope, receive, send)
    return sent


async def test_the_gateway_answers_and_keeps_its_state(app: GatewayApp) -> None:
    sent = await call(app, http_scope())
    assert sent[0]["status"] == 200
    assert orjson.loads(sent[1]["body"])["data"] == {"status": "SERVING"}
    assert app.state.gateway is app.gateway


async def test_an_error_before_the_response_is_an_internal_error_envelope(app: GatewayApp) -> None:
    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("boom")

    sent = await call(EnvelopeGuard(app.gateway, broken), http_scope("/api/v1/anything"))
    assert sent[0]["status"] == 500
    body = orjson.loads(sent[1]["body"])
    assert body["status"] == "error"
    assert body["error"]["code"] == "INTERNAL_ERROR"
    assert body["error"]["details"]["correlation_id"]
    assert "boom" not in sent[1]["body"].decode()


async def test_a_failing_middleware_still_answers_an_envelope(app: GatewayApp) -> None:
    class Broken:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                raise RuntimeError("middleware boom")
            await self.inner(scope, receive, send)

    app.add_middleware(Broken)
    sent = await call(app, http_scope("/api/v1/acp"))
    assert sent[0]["status"] == 500
    assert orjson.loads(sent[1]["body"])["error"]["code"] == "INTERNAL_ERROR"


async def test_an_error_after_the_response_started_is_left_to_the_server(app: GatewayApp) -> None:
    async def half(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("broken mid-response")

    with pytest.raises(RuntimeError, match="mid-response"):
        await call(EnvelopeGuard(app.gateway, half), http_scope())


async def test_websockets_are_refused(app: GatewayApp) -> None:
    sent = await call(app, {"type": "websocket", "path": "/api/v1/acp", "headers": []}, [])
    assert sent == [{"type": "websocket.close", "code": 1000, "reason": ""}]


async def test_lifespan_events_are_acknowledged(app: GatewayApp) -> None:
    incoming: list[Message] = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
    sent = await call(app, {"type": "lifespan"}, incoming)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
