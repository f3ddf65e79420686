"""CORS preflights answer with envelopes like every other answer, and a token in a URL is
refused saying why and what to do instead (issue 18, item 8);
Starlette still decides what is allowed (in process, real facade, httpx over ASGI)."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator

import httpx
import pytest

from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.gateway.http.fastapi_app import GatewaySettings, build_app

ALLOWED = "https://app.example"


@pytest.fixture
async def client(tmp_path: pathlib.Path) -> AsyncIterator[httpx.AsyncClient]:
    facade = open_facade(tmp_path / "acp.db")
    app = build_app(facade, GatewaySettings(cors_origins=(ALLOWED,)))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://acp") as http:
            yield http
    finally:
        await facade.close()


def _preflight(
    origin: str, method: str = "POST", headers: str = "authorization,content-type"
) -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": method,
        "Access-Control-Request-Headers": headers,
    }


async def test_an_allowed_preflight_is_an_ok_envelope(client: httpx.AsyncClient) -> None:
    response = await client.options("/api/v1/acp", headers=_preflight(ALLOWED))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.headers["access-control-allow-origin"] == ALLOWED
    assert "authorization" in response.headers["access-control-allow-headers"].lower()
    body = response.json()
    assert body["status"] == "ok"
    assert body["request_id"] == response.headers["x-request-id"]


@pytest.mark.parametrize(
    ("origin", "method", "refused"),
    [("https://evil.example", "POST", ["origin"]), (ALLOWED, "BREW", ["method"])],
)
async def test_a_refused_preflight_is_an_error_envelope_saying_what(
    client: httpx.AsyncClient, origin: str, method: str, refused: list[str]
) -> None:
    response = await client.options("/api/v1/acp", headers=_preflight(origin, method))
    assert response.status_code == 403
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["status"] == "error"
    assert body["error"]["code"] == "AUTH_FORBIDDEN"
    assert body["error"]["details"]["refused"] == refused
    assert "--cors-origin" in body["error"]["message"]
    assert "access-control-allow-origin" not in response.headers or origin == ALLOWED


@pytest.mark.parametrize("path", ["/api/v1/events/stream", "/api/v1/sessions"])
async def test_a_token_in_the_url_is_refused_saying_why_and_what_instead(
    client: httpx.AsyncClient, path: str
) -> None:
    response = await client.get(path, params={"token": "acp_secret"})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "INVALID_PARAMS"
    assert "refused on purpose" in error["message"]
    assert "Authorization: Bearer" in error["message"]
    assert "ticket" in error["message"]
    assert "acp_secret" not in response.text
