"""Clients nobody here wrote: curl for the envelope, a REST route and SSE; buf curl over
gRPC, finding the services by server reflection."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from tests import needs
from tests.gateway.conftest import Served

BUF = pathlib.Path(sys.executable).parent / "buf"


def run(*args: str, timeout: float = 15) -> subprocess.CompletedProcess[str]:
    """A bounded run; a stream still open at ``timeout`` raises TimeoutExpired with its output."""
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def curl(*args: str) -> subprocess.CompletedProcess[str]:
    return run(needs.program("curl"), "-sS", *args)


def buf_curl(
    served: Served, method: str, *args: str, timeout: float = 15
) -> subprocess.CompletedProcess[str]:
    if not BUF.exists():
        needs.unavailable(f"buf curl needs {BUF} (pip install -e '.[dev]')")
    url = f"http://{served.server.grpc_target}/{method}"
    return run(str(BUF), "curl", "--protocol", "grpc", "--http2-prior-knowledge", *args, url, timeout=timeout)


def test_curl_envelope_rest_and_errors(served: Served) -> None:
    auth = f"Authorization: Bearer {served.token()}"
    base = served.server.http
    created = curl(
        "-H", auth, "-d", '{"operation": "session.create", "params": {"title": "curl"}}', f"{base}/api/v1/acp"
    )
    body: dict[str, Any] = json.loads(created.stdout)
    assert body["status"] == "ok", body
    session_id = body["data"]["session"]["meta"]["id"]
    shown = json.loads(curl("-H", auth, f"{base}/api/v1/sessions/{session_id}").stdout)
    assert shown["data"]["session"]["title"] == "curl"
    refused = curl("-o", "/dev/null", "-w", "%{http_code}", f"{base}/api/v1/sessions")
    assert refused.stdout == "401"
    bad = json.loads(curl("-d", "{oops", f"{base}/api/v1/acp").stdout)
    assert bad["error"]["code"] == "INVALID_PARAMS"


def test_curl_sse(served: Served) -> None:
    auth = f"Authorization: Bearer {served.token()}"
    base = served.server.http
    created = json.loads(
        curl("-H", auth, "-d", '{"operation": "session.create"}', f"{base}/api/v1/acp").stdout
    )
    session_id = created["data"]["session"]["meta"]["id"]
    told = {"operation": "session.tell", "params": {"session_id": session_id, "content": "hi"}}
    assert json.loads(curl("-H", auth, "-d", json.dumps(told), f"{base}/api/v1/acp").stdout)["status"] == "ok"
    streamed = curl(
        "-N", "--max-time", "1.5", "-H", auth, f"{base}/api/v1/events/stream?session_id={session_id}"
    )
    assert streamed.returncode == 28  # ended by --max-time: the stream stays open
    frames = [frame.splitlines() for frame in streamed.stdout.split("\n\n") if frame.startswith("id: ")]
    # The tell's events at ACP 1.3 (no ACP-Version header: the newest).
    assert [lines[1] for lines in frames] == [
        "event: session.turn_started",
        "event: session.message",
        "event: session.message",
        "event: session.turn_completed",
    ]
    for lines in frames:
        event = json.loads(lines[2].removeprefix("data: "))
        assert lines[0] == f"id: {event['sequence']}"
    assert ": keep-alive" in streamed.stdout


def test_buf_curl_over_reflection(served: Served) -> None:
    listed = buf_curl(served, "", "--list-services")
    assert "cleveragents.acp.v1.SessionService" in listed.stdout.split(), listed.stderr
    version = buf_curl(served, "cleveragents.acp.v1.MetaService/GetVersion")
    assert json.loads(version.stdout)["supportedVersions"] == ["1.3", "1.2", "1.1"], version.stderr
    refused = buf_curl(served, "cleveragents.acp.v1.SessionService/ListSessions", "-d", "{}")
    assert refused.returncode != 0
    error = json.loads(refused.stderr)
    assert error["code"] == "unauthenticated"
    assert [d["type"] for d in error["details"]] == ["google.rpc.ErrorInfo", "cleveragents.acp.v1.Error"]
    listed_sessions = buf_curl(
        served,
        "cleveragents.acp.v1.SessionService/ListSessions",
        "-H",
        f"Authorization: Bearer {served.token()}",
        "-d",
        '{"page_size": 1}',
    )
    assert listed_sessions.returncode == 0, listed_sessions.stderr
    assert len(json.loads(listed_sessions.stdout).get("sessions", [])) <= 1


def json_values(text: str) -> list[Any]:
    """The JSON documents buf curl printed one after another."""
    decoder, found, position = json.JSONDecoder(), [], 0
    while position < len(text.rstrip()):
        value, end = decoder.raw_decode(text, position)
        found.append(value)
        position = end
        while position < len(text) and text[position].isspace():
            position += 1
    return found


def test_buf_curl_calls_and_follows_the_event_stream(served: Served) -> None:
    auth = ["-H", f"Authorization: Bearer {served.token()}"]
    created = buf_curl(
        served, "cleveragents.acp.v1.SessionService/CreateSession", *auth, "-d", '{"title": "buf"}'
    )
    assert created.returncode == 0, created.stderr
    session_id = json.loads(created.stdout)["session"]["meta"]["id"]
    told = buf_curl(
        served,
        "cleveragents.acp.v1.SessionService/TellSession",
        *auth,
        "-d",
        json.dumps({"session_id": session_id, "content": "/help"}),
    )
    assert told.returncode == 0, told.stderr
    shown = buf_curl(
        served,
        "cleveragents.acp.v1.SessionService/GetSession",
        *auth,
        "-d",
        json.dumps({"session_id": session_id}),
    )
    assert json.loads(shown.stdout)["session"]["messageCount"] == 2
    with pytest.raises(subprocess.TimeoutExpired) as info:
        buf_curl(
            served,
            "cleveragents.acp.v1.EventService/SubscribeEvents",
            *auth,
            "-d",
            json.dumps({"session_id": session_id}),
            timeout=3,
        )
    output = info.value.output
    events = [
        item["event"] for item in json_values(output.decode() if isinstance(output, bytes) else output or "")
    ]
    # The tell's events at ACP 1.3 (no acp-version metadata: the newest).
    assert [e["type"] for e in events] == [
        "session.turn_started",
        "session.message",
        "session.message",
        "session.turn_completed",
    ]
    sequences = [int(e["sequence"]) for e in events]
    assert sequences == sorted(set(sequences))
    assert {e["sessionId"] for e in events} == {session_id}
    refused = buf_curl(served, "cleveragents.acp.v1.EventService/SubscribeEvents", "-d", "{}")
    assert json.loads(refused.stderr)["code"] == "unauthenticated"
