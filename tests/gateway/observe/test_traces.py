"""One trace across ``agents gateway --upstream`` and ``agents serve``: real processes with
tracing switched on by the standard ``OTEL_*`` variables (the console exporter, so the test
reads the spans each process exported), a caller's ``traceparent`` continued over the HTTP hop
and the gRPC hop, and the events of the traced call carrying its trace id."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.server_process import ServerProcess, Tokens, start_gateway, start_server

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_SPAN}-01"
OTEL = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "acp-test", "OTEL_BSP_SCHEDULE_DELAY": "100"}


def spans_of(lines: list[str]) -> list[dict[str, Any]]:
    """The spans the console exporter printed among the process's other stdout lines."""
    text = "\n".join(lines)
    decoder = json.JSONDecoder()
    found: list[dict[str, Any]] = []
    index = 0
    while (start := text.find("{", index)) != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            index = start + 1
            continue
        if isinstance(value, dict) and "context" in value and "name" in value:
            found.append(value)
        index = end
    return found


def session_events(server: ServerProcess, token: str, session_id: str) -> list[dict[str, Any]]:
    """The session's events so far, read from the server's SSE stream (no traceparent)."""
    events: list[dict[str, Any]] = []
    params = {"session_id": session_id, "event_type": "session.message"}
    with (
        httpx.Client(base_url=server.http, timeout=10) as client,
        client.stream(
            "GET", "/api/v1/events/stream", params=params, headers={"Authorization": f"Bearer {token}"}
        ) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data:"):
                events.append(json.loads(line.removeprefix("data:")))
                if len(events) == 2:
                    break
    return events


@pytest.fixture
def traced_servers(tmp_path: pathlib.Path) -> Iterator[tuple[ServerProcess, ServerProcess, Tokens]]:
    tokens = Tokens.create(tmp_path)
    server = start_server(tmp_path, tokens=tokens.path, env=OTEL)
    try:
        gateway = start_gateway(tmp_path, server.grpc_target, env=OTEL)
        try:
            yield server, gateway, tokens
        finally:
            gateway.stop()
    finally:
        server.stop()


def test_one_trace_spans_the_gateway_and_the_server(
    traced_servers: tuple[ServerProcess, ServerProcess, Tokens],
) -> None:
    server, gateway, tokens = traced_servers
    headers = {"Authorization": f"Bearer {tokens.tokens['alice']}", "traceparent": TRACEPARENT}
    with httpx.Client(base_url=gateway.http, timeout=10) as client:
        created = client.post("/api/v1/acp", json={"operation": "session.create"}, headers=headers)
        assert created.status_code == 200, created.text
        session_id = created.json()["data"]["session"]["meta"]["id"]
        told = client.post(
            "/api/v1/acp",
            json={"operation": "session.tell", "params": {"session_id": session_id, "content": "hello"}},
            headers=headers,
        )
        assert told.status_code == 200, told.text
    events = session_events(server, tokens.tokens["alice"], session_id)
    gateway.stop()
    server.stop()
    gateway_spans = spans_of(gateway.stdout)
    server_spans = spans_of(server.stdout)
    assert gateway_spans, gateway.stdout[-20:]
    assert server_spans, server.stdout[-20:]
    outer = [s for s in gateway_spans if s["name"] == "session.tell"]
    inner = [s for s in server_spans if s["name"] == "session.tell"]
    assert len(outer) == 1
    assert len(inner) == 1
    assert outer[0]["context"]["trace_id"] == f"0x{TRACE_ID}"
    assert outer[0]["parent_id"] == f"0x{PARENT_SPAN}"
    assert inner[0]["context"]["trace_id"] == f"0x{TRACE_ID}"
    assert inner[0]["parent_id"] == outer[0]["context"]["span_id"]
    assert inner[0]["attributes"]["acp.operation"] == "session.tell"
    assert inner[0]["attributes"]["acp.code"] == "OK"
    assert inner[0]["attributes"]["acp.namespace"] in ("", "default")
    assert inner[0]["resource"]["attributes"]["service.name"] == "acp-test"
    assert events
    assert {event.get("trace_id") for event in events} == {TRACE_ID}
