"""The gateway as a FastAPI application users extend: mounted in their app, with their
routes, middleware and dependencies, an OpenAPI document that lists their routes, and
the hot paths unchanged; run under uvicorn with its access log, no stream ticket is logged."""

from __future__ import annotations

import asyncio
import logging
import pathlib
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from cleveragents.acp.facade import auth
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.gateway.http.dependencies import CallerClient
from cleveragents.acp.gateway.http.fastapi_app import GatewayApp, build_app
from cleveragents.acp.v1 import session_pb2


@pytest.fixture
async def facade(tmp_path: pathlib.Path) -> AsyncIterator[tuple[ServiceFacade, str]]:
    tokens = tmp_path / "tokens.toml"
    token = auth.create_token(tokens, "alice", ["default"])
    facade = open_facade(tmp_path / "acp.db", authenticator=auth.TokenAuthenticator(tokens))
    yield facade, token
    await facade.close()


def client(app: ASGIApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


async def test_mounted_under_a_prefix_every_path_answers(facade: tuple[ServiceFacade, str]) -> None:
    service, token = facade
    outer = FastAPI()
    outer.mount("/acp", build_app(service))

    @outer.get("/mine")
    async def mine() -> dict[str, str]:
        return {"app": "outer"}

    bearer = {"Authorization": f"Bearer {token}"}
    async with client(outer) as http:
        assert (await http.get("/mine")).json() == {"app": "outer"}
        listed = await http.post("/acp/api/v1/acp", json={"operation": "session.list"}, headers=bearer)
        assert listed.json()["status"] == "ok"
        rest = await http.get("/acp/api/v1/sessions", headers=bearer)
        assert rest.json()["data"] == {"sessions": [], "next_page_token": ""}
        assert (await http.get("/acp/healthz")).json()["data"] == {"status": "SERVING"}
        document = (await http.get("/acp/api/v1/openapi.json")).json()
        assert document["servers"] == [{"url": "/acp"}]
        assert "console/main.js" in (await http.get("/acp/")).text
        assert (await http.get("/acp/console/main.js")).status_code == 200
        assert (await http.get("/acp/api/v1/docs")).status_code == 200
        missing = await http.get("/acp/api/v1/nothing")
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "NOT_FOUND")
        wrong = await http.delete("/acp/api/v1/acp")
        assert wrong.json()["error"]["details"]["allowed_methods"] == ["POST"]


async def test_routes_and_dependencies_added_by_users(facade: tuple[ServiceFacade, str]) -> None:
    service, token = facade
    app = build_app(service)
    seen: list[str] = []

    def audit(request: Request) -> None:
        seen.append(request.url.path)

    def team(request: Request) -> str:
        if request.headers.get("x-team") != "a":
            raise HTTPException(403, "team a only")
        return "a"

    app.router.dependencies.append(Depends(audit))

    @app.get("/api/v1/extra/sessions", dependencies=[Depends(team)])
    async def session_titles(acp: CallerClient) -> dict[str, Any]:
        listed = await acp.call("session.list")
        assert isinstance(listed, session_pb2.ListSessionsResponse)
        return {"titles": [s.title for s in listed.sessions]}

    bearer = {"Authorization": f"Bearer {token}"}
    async with client(app) as http:
        await http.post(
            "/api/v1/acp", json={"operation": "session.create", "params": {"title": "t1"}}, headers=bearer
        )
        answered = await http.get("/api/v1/extra/sessions", headers={**bearer, "x-team": "a"})
        assert answered.json() == {"titles": ["t1"]}
        refused = await http.get("/api/v1/extra/sessions", headers={**bearer, "x-team": "b"})
        assert (refused.status_code, refused.json()) == (403, {"detail": "team a only"})
        no_token = await http.get("/api/v1/extra/sessions", headers={"x-team": "a"})
        assert no_token.status_code == 401
        assert no_token.json()["error"]["code"] == "AUTH_REQUIRED"
        document = (await http.get("/api/v1/openapi.json")).json()
    assert seen == ["/api/v1/extra/sessions"] * 3
    assert "get" in document["paths"]["/api/v1/extra/sessions"]
    assert document["paths"]["/api/v1/acp"]["post"]["operationId"] == "acp.envelope"


async def test_user_middleware_wraps_the_hot_paths_too(facade: tuple[ServiceFacade, str]) -> None:
    service, _ = facade
    app = build_app(service)
    seen: list[str] = []

    class Stamp:
        def __init__(self, inner: ASGIApp) -> None:
            self.inner = inner

        async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                seen.append(scope["path"])

                async def stamped(message: Any) -> None:
                    if message["type"] == "http.response.start":
                        message["headers"] = [*message["headers"], (b"x-stamp", b"1")]
                    await send(message)

                await self.inner(scope, receive, stamped)
                return
            await self.inner(scope, receive, send)

    app.add_middleware(Stamp)
    async with client(app) as http:
        health = await http.get("/healthz")
        version = await http.get("/api/v1/version")
        page = await http.get("/")
    assert [r.headers.get("x-stamp") for r in (health, version, page)] == ["1", "1", "1"]
    assert seen == ["/healthz", "/api/v1/version", "/"]


async def test_pages_carry_a_strict_policy(facade: tuple[ServiceFacade, str]) -> None:
    service, _ = facade
    async with client(build_app(service)) as http:
        for path in ("/", "/console/main.js", "/api/v1/docs", "/api/v1/docs/assets/swagger-ui-bundle.js"):
            response = await http.get(path)
            assert response.status_code == 200, path
            policy = response.headers["content-security-policy"]
            assert "default-src 'none'" in policy
            assert "script-src 'self';" in policy
            assert "unsafe" not in policy
            assert "frame-ancestors 'none'" in policy
            assert response.headers["x-content-type-options"] == "nosniff"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_an_access_log_never_shows_a_ticket(
    facade: tuple[ServiceFacade, str], caplog: pytest.LogCaptureFixture
) -> None:
    service, token = facade
    app: GatewayApp = build_app(service)
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, access_log=True, log_config=None, lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    caplog.set_level(logging.INFO, logger="uvicorn.access")
    # Captured at the logger itself: a uvicorn started earlier in this process with its default
    # logging config leaves "uvicorn.access" not propagating to the root, where caplog listens.
    access = logging.getLogger("uvicorn.access")
    access.addHandler(caplog.handler)
    try:
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            issued = await http.post(
                "/api/v1/acp",
                json={"operation": "events.ticket", "params": {"plan_id": "p1"}},
                headers={"Authorization": f"Bearer {token}"},
            )
            ticket = issued.json()["data"]["ticket"]
            refused = await http.get("/api/v1/events/stream", params={"plan_id": "p2", "ticket": ticket})
            assert refused.status_code == 401
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        access.removeHandler(caplog.handler)
    lines = [record.getMessage() for record in caplog.records if record.name == "uvicorn.access"]
    assert any("/api/v1/events/stream?plan_id=p2&ticket=[redacted]" in line for line in lines), lines
    assert all(ticket not in line for line in lines)
