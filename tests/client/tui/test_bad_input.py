"""The TUI under bad input: a wrong token, a server that goes away and comes back, a session of
10,000 messages and a plan of 5,000 steps. Each is told in clear words and the app keeps
answering keys; the time a probe key press took is recorded (the test's ``user_properties``,
and printed: ``pytest -s`` shows it), never asserted."""

from __future__ import annotations

import pathlib
import signal
import time

import httpx
import pytest
from textual.pilot import Pilot
from ulid import ULID

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.client.tui.modals import KeysScreen
from cleveragents.acp.client.tui.plans import PlanScreen, PlansScreen
from cleveragents.acp.client.tui.sessions import SessionScreen, SessionsScreen
from cleveragents.acp.contract import codec
from cleveragents.acp.contract.retry import RetryPolicy
from cleveragents.acp.v1 import plan_pb2, session_pb2
from tests.client.tui.helpers import app_on, screen_text, settle, tour, until
from tests.server_process import Children, ServerProcess, Tokens, start_server

MESSAGES = 10_000
STEPS = 5_000


def http_client(server: ServerProcess, token: str) -> ACPClient:
    http = httpx.AsyncClient(base_url=server.http, timeout=httpx.Timeout(None, connect=5.0))
    # No retrying: a call the server cannot answer fails at once (the banner says so).
    return ACPClient(HTTPTransport(http, owns_client=True), token=token, retry=RetryPolicy.OFF)


async def probe(pilot: Pilot[None], request: pytest.FixtureRequest, name: str) -> None:
    """Press f1 and wait for the key map: the app still answers keys. The time is recorded."""
    started = time.monotonic()
    await pilot.press("f1")
    await until(pilot, lambda: isinstance(pilot.app.screen, KeysScreen))
    seconds = round(time.monotonic() - started, 3)
    request.node.user_properties.append((name, seconds))
    print(f"{name}: {seconds} s")
    await pilot.press("escape")
    await until(pilot, lambda: not isinstance(pilot.app.screen, KeysScreen))


async def test_a_wrong_token_is_told_and_the_app_stays_usable(
    tmp_path: pathlib.Path, children: Children
) -> None:
    tokens = Tokens.create(tmp_path)
    server = children.server(start_server(tmp_path, tokens=tokens.path, name="tui"))
    client = http_client(server, "acp_not-a-token")
    app = app_on(client, where=server.http)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: "check the token" in app.banner)
            assert app.banner.startswith("AUTH_")
            assert server.http in app.banner
            await until(pilot, lambda: "could not list the sessions" in screen_text(app, "#status"))
            await pilot.press("p")
            await until(pilot, lambda: isinstance(app.screen, PlansScreen))
            assert "check the token" in screen_text(app, "Banner")
    finally:
        await client.close()
        server.stop()


async def test_a_server_that_goes_away_and_comes_back(tmp_path: pathlib.Path, children: Children) -> None:
    tokens = Tokens.create(tmp_path)
    server = children.server(start_server(tmp_path, tokens=tokens.path, name="tui"))
    ports = ["--http-port", server.http.rsplit(":", 1)[1]]
    client = http_client(server, tokens.tokens["root"])
    made = await client.call("session.create", title="outage")
    assert isinstance(made, session_pb2.CreateSessionResponse)
    app = app_on(client, where=server.http)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, SessionScreen))
            screen = app.screen
            assert isinstance(screen, SessionScreen)
            server.stop(signal.SIGKILL)
            await until(pilot, lambda: "reconnecting" in app.banner)
            await pilot.press(*"/help", "enter")
            await settle(pilot)
            # The tell could not be sent: what was typed is still there.
            assert screen.query_one("#prompt").value == "/help"  # type: ignore[attr-defined]
            assert "What you typed is kept" in app.banner
            server = children.server(start_server(tmp_path, *ports, tokens=tokens.path, name="tui"))
            await until(pilot, lambda: app.banner == "")
            await pilot.press("enter")
            await until(pilot, lambda: len(screen.messages) == 2)
            assert screen.query_one("#prompt").value == ""  # type: ignore[attr-defined]
    finally:
        await client.close()
        server.stop()


async def long_session(client: ACPClient) -> str:
    """A session of ``MESSAGES`` messages, imported (a tell each would take minutes)."""
    made = await client.call("session.create", title="long")
    assert isinstance(made, session_pb2.CreateSessionResponse)
    await client.call("session.tell", session_id=made.session.meta.id, content="/help")
    exported = codec.to_dict(await client.call("session.export", session_id=made.session.meta.id))
    document = exported["document"]
    reply = document["messages"][1]
    document["messages"] = [
        {
            **reply,
            "id": str(ULID()),
            "index": i,
            "role": "MESSAGE_ROLE_USER" if i % 2 == 0 else "MESSAGE_ROLE_ORCHESTRATOR",
            "content": f"message {i}",
            "turn_id": "",
            "in_reply_to": "",
        }
        for i in range(MESSAGES)
    ]
    document["turns"] = []
    document["session"]["message_count"] = MESSAGES
    imported = await client.call("session.import", document=document, new_id=True)
    assert isinstance(imported, session_pb2.ImportSessionResponse)
    await client.call("session.delete", session_id=made.session.meta.id)
    return imported.session.meta.id


async def long_plan(client: ACPClient) -> str:
    """A plan of ``STEPS`` steps whose first step fails (running them all would take minutes)."""
    await client.call("automation_profile.add", name="long", spec={"max_steps": STEPS})
    steps = [{"id": "s0", "tool": "fs.read", "args": {"path": "missing.txt"}}]
    steps += [
        {"id": f"s{i}", "tool": "fs.write", "args": {"path": f"f{i}.txt", "content": "x"}}
        for i in range(1, STEPS)
    ]
    await client.call(
        "action.add", name="long", spec={"actor": "scripted", "steps": steps, "automation_profile": "long"}
    )
    used = await client.call("plan.use", action="long", project="demo")
    assert isinstance(used, plan_pb2.UsePlanResponse)
    await client.call("plan.execute", plan_id=used.plan.meta.id, wait=True)
    return used.plan.meta.id


async def test_a_long_session_and_a_long_plan(
    client: ACPClient, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    await tour(client, tmp_path)
    session_id = await long_session(client)
    plan_id = await long_plan(client)
    app = app_on(client)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, SessionsScreen)
        await pilot.press("enter")
        await until(
            pilot, lambda: isinstance(app.screen, SessionScreen) and len(app.screen.messages) == MESSAGES
        )
        screen = app.screen
        assert isinstance(screen, SessionScreen)
        assert screen.session_id == session_id
        await settle(pilot)
        assert f"{MESSAGES - 200} earlier messages" in str(screen.query_one("#history").lines[0].text)  # type: ignore[attr-defined]
        await probe(pilot, request, "probe_seconds_long_session")
        await pilot.press("ctrl+o")
        await settle(pilot)
        assert f"{MESSAGES - 400} earlier messages" in str(screen.query_one("#history").lines[0].text)  # type: ignore[attr-defined]
        await pilot.press("escape", "p")
        await until(pilot, lambda: isinstance(app.screen, PlansScreen))
        await settle(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, PlanScreen) and app.screen.decisions is not None)
        assert "execute/failed" in screen_text(app, "#summary")
        await pilot.press("2")
        await settle(pilot)
        await probe(pilot, request, "probe_seconds_long_plan")
        status = screen_text(app, "#status-text")
        assert "step_failed" in status
        assert "'s0' (fs.read) failed" in status
        assert app.screen.query_one("#decisions").root.label.plain.endswith(f"{STEPS} steps")  # type: ignore[attr-defined]
        assert isinstance(app.screen, PlanScreen)
        assert app.screen.plan_id == plan_id
