"""Credentials (issue 17, findings 5, 6, 8 and 11): tokens that expire, rotate and revoke;
a revoked or expired principal's open streams end with AUTH_REQUIRED; two credentials on
one call are refused alike on every wire; the authenticator keeps nothing per token sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import time
from typing import Any

import grpc
import httpx
import orjson
import pytest
from starlette.requests import Request

from cleveragents.acp.client.grpc_transport import error_from_rpc
from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.contract.transport import TICKET_METADATA
from cleveragents.acp.facade import auth
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.gateway.http.dependencies import CallerClient, caller_client
from cleveragents.acp.gateway.http.fastapi_app import build_app
from cleveragents.acp.v1 import session_pb2
from tests.conformance.backends import Backend, open_backend
from tests.conformance.harness import Run, run_everywhere
from tests.server_process import Tokens

# A hang guard only: the server checks a stream's caller every RECHECK_SECONDS (0.5 s)
# against a token file it re-reads every CHECK_SECONDS (1 s), so a stream ends within 1.5 s.
STREAM_GUARD_SECONDS = 10.0


def expire(path: pathlib.Path, name: str, *, previous: bool = False) -> None:
    """Set a principal's expiry (or its rotated-out token's) one minute in the past."""
    past = time.time() - 60
    entries = [
        (dataclasses.replace(e, previous_expires=past) if previous else dataclasses.replace(e, expires=past))
        if e.name == name
        else e
        for e in auth.load(path)
    ]
    auth.write(path, entries)


def narrow(path: pathlib.Path, name: str, namespaces: frozenset[str]) -> None:
    """What an operator does by editing the token file: keep the principal, fewer namespaces."""
    entries = [
        dataclasses.replace(e, namespaces=namespaces) if e.name == name else e for e in auth.load(path)
    ]
    auth.write(path, entries)


@pytest.fixture(scope="module")
def lifetimes(tmp_path_factory: pytest.TempPathFactory) -> Tokens:
    """alice (contract suite), ``expired``, ``rotated`` (old and new token, in grace) and
    ``graced`` (old token past its grace)."""
    made = Tokens.create(tmp_path_factory.mktemp("lifetimes"))
    path = made.path
    made.tokens["expired"] = auth.create_token(path, "expired", ["default"], expires_in=3600)
    expire(path, "expired")
    made.tokens["long"] = auth.create_token(path, "long", ["default"], expires_in=30 * 86400)
    made.tokens["rotated-old"] = auth.create_token(path, "rotated", ["default"])
    made.tokens["rotated-new"] = auth.rotate_token(path, "rotated", grace_seconds=3600)
    made.tokens["graced-old"] = auth.create_token(path, "graced", ["default"])
    made.tokens["graced-new"] = auth.rotate_token(path, "graced", grace_seconds=3600)
    expire(path, "graced", previous=True)
    made.tokens["cut-old"] = auth.create_token(path, "cut", ["default"])
    made.tokens["cut-new"] = auth.rotate_token(path, "cut", grace_seconds=0)
    return made


async def token_lifetimes(run: Run) -> None:
    for who in ("long", "rotated-old", "rotated-new", "graced-new", "cut-new"):
        await run.client(who).call("session.list")
    for who in ("expired", "graced-old"):
        err = await run.fails(run.client(who).call("session.list"), "AUTH_REQUIRED", "TOKEN_EXPIRED")
        assert err.details["scheme"] == "Bearer"
    await run.fails(run.client("cut-old").call("session.list"), "AUTH_REQUIRED")
    if run.kind in ("http", "rest", "gateway"):
        async with run.backend.http_client() as http:
            answer = await http.get(
                "/api/v1/sessions", headers={"Authorization": f"Bearer {run.backend.token('expired')}"}
            )
        assert answer.status_code == 401
        assert answer.headers["www-authenticate"] == 'Bearer realm="acp", error="invalid_token"'


async def test_tokens_expire_and_rotate_on_every_transport(tmp_path: pathlib.Path, lifetimes: Tokens) -> None:
    await run_everywhere(token_lifetimes, tmp_path, lifetimes)


def test_rotate_and_revoke_in_the_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "tokens.toml"
    old = auth.create_token(path, "a", ["default"], role="reader", expires_in=90)
    authenticator = auth.TokenAuthenticator(path, check_seconds=0)
    assert authenticator.authenticate(old).role == "reader"
    new = auth.rotate_token(path, "a", grace_seconds=60)
    assert authenticator.authenticate(old).name == authenticator.authenticate(new).name == "a"
    (entry,) = auth.load(path)
    assert entry.previous_expires is not None
    assert entry.expires is not None
    assert entry.previous_expires <= entry.expires
    auth.revoke_token(path, "a")
    for token in (old, new):
        with pytest.raises(ACPError) as info:
            authenticator.authenticate(token)
        assert info.value.code == "AUTH_REQUIRED"
    with pytest.raises(auth.TokenFileError, match="no principal"):
        auth.revoke_token(path, "a")
    with pytest.raises(auth.TokenFileError, match="no principal"):
        auth.rotate_token(path, "a")


@pytest.mark.parametrize("text", ["90s", "15m", "12h", "30d"])
def test_durations(text: str) -> None:
    assert auth.parse_duration(text) == {"90s": 90, "15m": 900, "12h": 43200, "30d": 2592000}[text]


@pytest.mark.parametrize("text", ["", "0s", "12", "h", "1.5h", "-1d", "1w", "99999999999d", "1h30m"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(auth.TokenFileError, match="duration"):
        auth.parse_duration(text)


# -- open streams end when their principal goes ------------------------------------------------


async def stream_ends(backend: Backend, change: Any) -> ACPError:
    client = backend.client("victim")
    stream = client.subscribe({})
    try:
        async with asyncio.timeout(STREAM_GUARD_SECONDS):
            # The stream is admitted once the first (keepalive-driven) step is under way.
            first = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0.3)
            change()

            async def drain() -> None:
                await first
                async for _ in stream:
                    pass

            with pytest.raises(ACPError) as info:
                await drain()
    finally:
        await stream.aclose()  # type: ignore[attr-defined]
    return info.value


@pytest.mark.parametrize("kind", ["http", "grpc", "local"])
@pytest.mark.parametrize("how", ["revoke", "expire", "narrow"])
async def test_open_streams_end_when_the_principal_goes(kind: str, how: str, tmp_path: pathlib.Path) -> None:
    """Finding 5: the stream received 6 more events after revocation; now it ends with
    AUTH_REQUIRED (SSE's error frame, gRPC's UNAUTHENTICATED) within 1.5 s by design.
    Issue 31, finding 6: a namespace taken from the principal in the token file ends its
    open streams too, with AUTH_FORBIDDEN (they kept delivering that namespace's events)."""
    tokens = Tokens.create(tmp_path)
    tokens.tokens["victim"] = auth.create_token(tokens.path, "victim", ["default", "team"], role="reader")
    async with open_backend(kind, tmp_path / "backend", tokens, keepalive_seconds=0.2) as backend:
        started = time.monotonic()

        def change() -> None:
            nonlocal started
            started = time.monotonic()
            if how == "revoke":
                auth.revoke_token(tokens.path, "victim")
            elif how == "narrow":
                narrow(tokens.path, "victim", frozenset({"team"}))
            else:
                expire(tokens.path, "victim")

        err = await stream_ends(backend, change)
        took = time.monotonic() - started
    if how == "narrow":
        assert err.code == "AUTH_FORBIDDEN", err
        assert err.details.get("refinement") == "PRINCIPAL_NARROWED", err
        assert err.details.get("namespaces") == ["default"], err
        return
    assert err.code == "AUTH_REQUIRED", err
    if how == "expire":
        assert err.details.get("refinement") == "TOKEN_EXPIRED", err
    print(f"{kind} stream ended {took:.2f}s after {how}")


# -- two credentials ---------------------------------------------------------------------------


def refusal(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 401, answer.text
    assert answer.headers["www-authenticate"] == 'Bearer realm="acp", error="invalid_request"'
    body = orjson.loads(answer.content)
    assert body["error"]["code"] == "AUTH_REQUIRED", body
    assert body["error"]["details"]["refinement"] == "AMBIGUOUS_CREDENTIALS", body
    return dict(body["error"])


async def grpc_refusal(target: str, metadata: list[tuple[str, str]]) -> ACPError:
    op = catalog.OPERATIONS["session.list"]
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(
            op.full_method,
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=session_pb2.ListSessionsResponse.FromString,
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call(session_pb2.ListSessionsRequest(), metadata=tuple(metadata), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    return error_from_rpc(info.value)


async def test_two_credentials_are_refused_alike_on_every_wire(tmp_path: pathlib.Path) -> None:
    """Finding 8: two Authorization headers made HTTP take the first and gRPC the last; a
    header beside ``auth.token`` or a stream ticket was a different error again."""
    tokens = Tokens.create(tmp_path)
    alice, bob = tokens.tokens["alice"], tokens.tokens["bob"]
    two = [("authorization", f"Bearer {alice}"), ("authorization", f"Bearer {bob}")]
    same = [("authorization", f"Bearer {alice}"), ("authorization", f"Bearer {alice}")]
    async with open_backend("http", tmp_path / "backend", tokens) as backend:
        async with backend.http_client() as http:
            messages = set()
            for headers in (two, same):
                body = orjson.dumps({"operation": "session.list"})
                messages.add(
                    refusal(await http.post("/api/v1/acp", content=body, headers=headers))["message"]
                )
                messages.add(refusal(await http.get("/api/v1/sessions", headers=headers))["message"])
                messages.add(refusal(await http.get("/api/v1/events/stream", headers=headers))["message"])
            both = orjson.dumps({"operation": "session.list", "auth": {"token": alice}})
            refusal(await http.post("/api/v1/acp", content=both, headers=[same[0]]))
            ticket = await backend.client().call("events.ticket", namespace="default")
            stream = await http.get(
                "/api/v1/events/stream",
                params={"ticket": ticket.ticket, "namespace": "default"},  # type: ignore[attr-defined]
                headers=[same[0]],
            )
            refusal(stream)
        assert len(messages) == 1, messages
        for metadata in (two, same, [same[0], (TICKET_METADATA, "acpt_x")]):
            err = await grpc_refusal(backend.grpc_target, metadata)
            assert err.code == "AUTH_REQUIRED", err
            assert err.details["refinement"] == "AMBIGUOUS_CREDENTIALS", err
        assert (await grpc_refusal(backend.grpc_target, two)).message in messages
        # The console's and the docs' routes (FastAPI's side of the gateway) refuse alike.
        async with backend.http_client() as http:
            for path in ("/", "/console/main.js", "/api/v1/docs", "/api/v1/openapi.json", "/nothing"):
                for headers in (two, same):
                    assert refusal(await http.get(path, headers=headers))["message"] in messages, path


async def test_routes_users_add_refuse_two_credentials(tmp_path: pathlib.Path) -> None:
    """The ``CallerClient`` dependency of the routes users add took the first of two
    Authorization headers; now it and every route of the application refuse them."""
    tokens = Tokens.create(tmp_path)
    alice, bob = tokens.tokens["alice"], tokens.tokens["bob"]
    two = [("authorization", f"Bearer {alice}"), ("authorization", f"Bearer {bob}")]
    facade = open_facade(tmp_path / "acp.db", authenticator=auth.TokenAuthenticator(tokens.path))
    try:
        app = build_app(facade)

        @app.get("/api/v1/extra/sessions")
        async def count(acp: CallerClient) -> dict[str, int]:
            listed = await acp.call("session.list")
            return {"sessions": len(listed.sessions)}  # type: ignore[attr-defined]

        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            answered = await http.get("/api/v1/extra/sessions", headers=[two[0]])
            assert answered.json() == {"sessions": 0}
            refusal(await http.get("/api/v1/extra/sessions", headers=two))
        # The dependency itself, wherever the application is mounted.
        scope = {
            "type": "http",
            "app": app,
            "method": "GET",
            "path": "/",
            "headers": [(k.encode(), v.encode()) for k, v in two],
        }
        with pytest.raises(ACPError) as refused:
            caller_client(Request(scope))
        assert refused.value.code == "AUTH_REQUIRED"
        assert refused.value.details["refinement"] == "AMBIGUOUS_CREDENTIALS"
    finally:
        await facade.close()
