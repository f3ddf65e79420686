"""The HTTP gateway enters the facade through the same seam as the gRPC server
(``ServiceFacade.invoke``, with a ``CallContext``), and an envelope call negotiates its
version once and makes at most one request id (in process, real facade; the counters only
watch the real functions)."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from cleveragents.acp.contract import envelope, versions
from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.gateway import common
from cleveragents.acp.gateway.http.fastapi_app import build_app


@pytest.fixture
async def served(tmp_path: pathlib.Path) -> AsyncIterator[tuple[ServiceFacade, httpx.AsyncClient]]:
    facade = open_facade(tmp_path / "acp.db")
    transport = httpx.ASGITransport(app=build_app(facade))
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        yield facade, http
    await facade.close()


def counting(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[Any]:
    calls: list[Any] = []
    real: Callable[..., Any] = getattr(module, name)

    def counted(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(module, name, counted)
    return calls


async def test_the_gateway_calls_the_facade_with_a_call_context(
    served: tuple[ServiceFacade, httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    facade, http = served
    seen: list[CallContext] = []
    invoke = facade.invoke

    async def watched(op: Any, request: Any, ctx: CallContext) -> Any:
        seen.append(ctx)
        return await invoke(op, request, ctx)

    monkeypatch.setattr(facade, "invoke", watched)
    answer = await http.post(
        "/api/v1/acp",
        json={"operation": "meta.version", "request_id": "r-7", "acp_version": "1.1"},
    )
    assert answer.status_code == 200, answer.text
    assert [(c.request_id, c.acp_version, c.served_version) for c in seen] == [("r-7", "1.1", "1.1")]
    assert answer.json()["acp_version"] == answer.headers["ACP-Version"] == "1.1"


@pytest.mark.parametrize(
    ("body", "headers", "made"),
    [
        ({"operation": "meta.version"}, {}, 1),
        ({"operation": "meta.version", "request_id": "r-body"}, {}, 0),
        ({"operation": "meta.version"}, {"X-Request-ID": "r-header"}, 0),
    ],
)
async def test_an_envelope_call_negotiates_once_and_makes_at_most_one_id(
    served: tuple[ServiceFacade, httpx.AsyncClient],
    monkeypatch: pytest.MonkeyPatch,
    body: dict[str, Any],
    headers: dict[str, str],
    made: int,
) -> None:
    _, http = served
    negotiations = counting(monkeypatch, versions.VersionTable, "negotiate")
    ids = counting(monkeypatch, envelope, "new_request_id")
    ids_in_common = counting(monkeypatch, common, "new_request_id")
    answer = await http.post("/api/v1/acp", json={**body, "acp_version": "1.2"}, headers=headers)
    assert answer.status_code == 200, answer.text
    assert len(negotiations) == 1
    assert len(ids) + len(ids_in_common) == made
    expected = body.get("request_id") or headers.get("X-Request-ID") or answer.json()["request_id"]
    assert answer.json()["request_id"] == answer.headers["X-Request-ID"] == expected


async def test_an_unsupported_version_is_still_labelled_and_refused_once(
    served: tuple[ServiceFacade, httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, http = served
    negotiations = counting(monkeypatch, versions.VersionTable, "negotiate")
    answer = await http.post("/api/v1/acp", json={"operation": "meta.version", "acp_version": "9.9"})
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "VERSION_MISMATCH"
    assert answer.json()["acp_version"] == versions.CURRENT
    # The facade's refusal, then the label of the answer (no version was agreed).
    assert len(negotiations) == 2
