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
from cleveragents.acp.gateway.http.endpoint import Gateway
from cleveragents.acp.gateway.http.fastapi_app import EnvelopeGuard, GatewayApp, build_app


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


class _Failing(Gateway):
    """A gateway whose answer to every request is a stream that raises, before or after it
    starts (as ``SSEResponse`` could): what ``serve`` does then."""

    def __init__(self, service: Any, *, started: bool) -> None:
        super().__init__(service)
        self.started = started

    async def handle(self, request: Any, found: Any = None) -> Any:
        async def answer(scope: Scope, receive: Receive, send: Send) -> None:
            if self.started:
                await send({"type": "http.response.start", "status": 200, "headers": []})
            raise RuntimeError("stream boom")

        return answer


async def test_the_hot_paths_answer_an_envelope_for_an_error_before_the_response(app: GatewayApp) -> None:
    sent = await call(_Failing(app.gateway.service, started=False), http_scope())
    assert sent[0]["status"] == 500
    assert orjson.loads(sent[1]["body"])["error"]["code"] == "INTERNAL_ERROR"
    assert "boom" not in sent[1]["body"].decode()
    with pytest.raises(RuntimeError, match="stream boom"):
        await call(_Failing(app.gateway.service, started=True), http_scope())


def envelope_call(headers: list[tuple[bytes, bytes]], body: dict[str, Any]) -> tuple[Scope, list[Message]]:
    scope = {**http_scope("/api/v1/acp"), "method": "POST", "headers": headers}
    return scope, [{"type": "http.request", "body": orjson.dumps(body), "more_body": False}]


@pytest.mark.parametrize(
    ("headers", "token", "status", "code"),
    [
        # Another header repeated: still one Authorization value.
        ([(b"x-a", b"1"), (b"x-a", b"2"), (b"authorization", b"Bearer t")], None, 200, None),
        (
            [(b"authorization", b"Bearer t"), (b"x-a", b"1"), (b"authorization", b"Bearer u")],
            None,
            401,
            "AUTH_REQUIRED",
        ),
        # An empty Authorization header is still a second credential beside auth.token.
        ([(b"authorization", b"")], "t", 401, "AUTH_REQUIRED"),
        ([(b"x-a", b"1"), (b"x-a", b"2")], "t", 200, None),
    ],
)
async def test_authorization_headers_are_counted_whatever_else_repeats(
    app: GatewayApp, headers: list[tuple[bytes, bytes]], token: str | None, status: int, code: str | None
) -> None:
    body: dict[str, Any] = {"operation": "meta.version"}
    if token is not None:
        body["auth"] = {"token": token}
    sent = await call(app, *envelope_call(headers, body))
    assert sent[0]["status"] == status
    answer = orjson.loads(sent[1]["body"])
    if code is not None:
        assert (answer["error"]["code"], answer["error"]["details"]["refinement"]) == (
            code,
            "AMBIGUOUS_CREDENTIALS",
        )
