"""SSE at /api/v1/events/stream on a real server: admission before headers, frames,
keep-alive, resume, namespaces, and the end of a slow subscriber."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import pytest

from cleveragents.acp.contract import sse
from tests.gateway.conftest import Served
from tests.gateway.test_http import data_of, envelope, error_of
from tests.server_process import Children, Tokens, start_server

STREAM = "/api/v1/events/stream"


@pytest.fixture
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.server.http, timeout=10) as client:
        yield client


class Frames:
    """Reads SSE frames (and comments) from an open response, each read bounded in time."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self.lines = response.iter_lines()
        self.parser = sse.Parser()
        self.comments: list[str] = []

    def next(self, timeout: float = 5.0) -> sse.Event:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = next(self.lines)
            if line.startswith(":"):
                self.comments.append(line)
            for event in self.parser.feed(line):
                return event
        raise AssertionError(f"no frame within {timeout}s (comments: {self.comments[-3:]})")

    def quiet_for(self, seconds: float) -> None:
        """Only comments arrive for ``seconds`` (keep-alives come every 0.3 s)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            line = next(self.lines)
            assert line == "" or line.startswith(":"), line
            if line.startswith(":"):
                self.comments.append(line)


@contextmanager
def stream(client: httpx.Client, token: str | None, **kwargs: Any) -> Iterator[Frames]:
    headers = kwargs.pop("headers", {})
    if token:
        headers["Authorization"] = f"Bearer {token}"
    with client.stream("GET", STREAM, headers=headers, **kwargs) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        yield Frames(response)


def new_session(client: httpx.Client, token: str) -> str:
    session_id: str = data_of(envelope(client, {"operation": "session.create"}, token))["session"]["meta"][
        "id"
    ]
    return session_id


def tell(client: httpx.Client, token: str, session_id: str, text: str) -> None:
    data_of(
        envelope(
            client,
            {"operation": "session.tell", "params": {"session_id": session_id, "content": text}},
            token,
        )
    )


def test_admission_errors_are_envelopes_not_streams(http: httpx.Client, served: Served) -> None:
    error_of(http.get(STREAM), "AUTH_REQUIRED")
    auth = {"Authorization": f"Bearer {served.token()}"}
    assert (
        error_of(http.get(STREAM, params={"event_type": "bogus"}, headers=auth), "INVALID_PARAMS")["field"]
        == "event_type"
    )
    error_of(http.get(STREAM, params={"after_sequence": "soon"}, headers=auth), "INVALID_PARAMS")
    error_of(http.get(STREAM, params={"bogus": "1"}, headers=auth), "INVALID_PARAMS")
    resumed = http.get(STREAM, headers={**auth, "Last-Event-ID": "yesterday"})
    assert error_of(resumed, "INVALID_PARAMS")["field"] == "Last-Event-ID"
    bob = {"Authorization": f"Bearer {served.token('bob')}"}
    error_of(http.get(STREAM, params={"namespace": "default"}, headers=bob), "AUTH_FORBIDDEN")
    error_of(http.get(STREAM, headers={**auth, "ACP-Version": "9.9"}), "VERSION_MISMATCH")


# The events of one tell at ACP 1.3: the turn starts, the user's message and the reply, the turn ends.
TELL_EVENTS = ["session.turn_started", "session.message", "session.message", "session.turn_completed"]


def test_frames_keepalive_and_resume(http: httpx.Client, served: Served) -> None:
    token = served.token()
    session_id = new_session(http, token)
    with stream(http, token, params={"session_id": session_id}) as frames:
        frames.quiet_for(0.8)
        assert ": keep-alive" in frames.comments
        tell(http, token, session_id, "one")
        one = [frames.next() for _ in TELL_EVENTS]
    # The tell's events at ACP 1.3 (no ACP-Version header: the newest).
    assert [frame.event for frame in one] == TELL_EVENTS
    for frame in one:
        event = orjson.loads(frame.data)
        assert event["session_id"] == session_id
        assert event["sequence"] == frame.id
    ids = [int(frame.id or 0) for frame in one]
    assert ids == sorted(set(ids))

    tell(http, token, session_id, "two")
    # Resume after one's reply: one's turn_completed, then two's turn.
    with stream(
        http, token, params={"session_id": session_id}, headers={"Last-Event-ID": one[2].id}
    ) as frames:
        resumed = [frames.next() for _ in range(3)]
    assert resumed[0].id == one[3].id
    assert [f.event for f in resumed] == ["session.turn_completed", "session.turn_started", "session.message"]
    assert orjson.loads(resumed[2].data)["session_message"]["message"]["content"] == "two"

    with stream(http, token, params={"session_id": session_id, "after_sequence": one[3].id}) as frames:
        assert frames.next().event == "session.turn_started"
        assert orjson.loads(frames.next().data)["session_message"]["message"]["content"] == "two"

    # A filter skips the turn event before the first message.
    with stream(
        http, token, params={"session_id": session_id, "event_type": ["plan.created", "session.message"]}
    ) as frames:
        assert frames.next().id == one[1].id


def test_streams_deliver_only_permitted_namespaces(http: httpx.Client, served: Served) -> None:
    session_id = new_session(http, served.token("alice"))
    with (
        stream(http, served.token("bob")) as bob,
        stream(http, served.token("root"), params={"session_id": session_id}) as root,
    ):
        tell(http, served.token("alice"), session_id, "secret")
        assert orjson.loads(root.next().data)["namespace"] == "default"
        bob.quiet_for(1.0)


def _plan(client: httpx.Client, token: str, folder: pathlib.Path) -> str:
    """A one-step plan, ready to execute."""
    folder.mkdir()
    steps = [{"tool": "fs.write", "args": {"path": "a.txt", "content": "a"}}]
    for operation, params in (
        ("resource.add", {"name": "site", "spec": {"type": "directory", "path": str(folder)}}),
        ("project.add", {"name": "demo", "spec": {"resources": ["site"]}}),
        ("action.add", {"name": "one", "spec": {"actor": "scripted", "steps": steps}}),
    ):
        data_of(envelope(client, {"operation": operation, "params": params}, token))
    used = data_of(
        envelope(client, {"operation": "plan.use", "params": {"action": "one", "project": "demo"}}, token)
    )
    plan_id: str = used["plan"]["meta"]["id"]
    return plan_id


def test_a_slow_subscriber_ends_with_an_error_frame(tmp_path: pathlib.Path, children: Children) -> None:
    """A queue of one event: a commit of two (a plan entering its execute phase publishes
    plan.phase_changed and plan.state_changed together) ends the live subscriber."""
    tokens = Tokens.create(tmp_path)
    server = children.server(
        start_server(tmp_path, tokens=tokens.path, env={"ACP_EVENT_QUEUE_SIZE": "1"}, name="slow")
    )
    try:
        token = tokens.tokens["alice"]
        with httpx.Client(base_url=server.http, timeout=10) as client:
            plan_id = _plan(client, token, tmp_path / "site")
            with stream(client, token) as frames:
                # The backlog (plan.created), then the subscriber is live.
                received = [frames.next()]
                assert received[0].event == "plan.created"
                frames.quiet_for(0.4)
                data_of(
                    envelope(client, {"operation": "plan.execute", "params": {"plan_id": plan_id}}, token)
                )
                received.append(frames.next())
                while received[-1].event != sse.ERROR_EVENT:
                    received.append(frames.next())
        error = orjson.loads(received[-1].data)
        assert error["status"] == "error"
        assert error["error"]["code"] == "BUDGET_EXCEEDED"
        delivered = [int(f.id or 0) for f in received[:-1]]
        assert error["error"]["details"]["last_sequence"] == (delivered[-1] if delivered else 0)
    finally:
        assert server.stop() == 0, server.stderr()
