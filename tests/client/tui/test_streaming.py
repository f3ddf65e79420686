"""A model orchestrator's turn in the TUI (the fake OpenAI server, on the test's loop): its text
appears piece by piece before the reply is stored; a running turn is cancelled with ctrl+t."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from textual.widgets import Input, RichLog, Select

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.tui.sessions import SessionScreen
from cleveragents.acp.v1 import session_pb2
from tests.client.tui.helpers import app_on, screen_text, settle, until
from tests.facade.plans.model_world import KEY, KEY_ENV
from tests.fake_openai import FakeOpenAI, Stream, turn

PIECES = ["The tests ", "are green ", "on every ", "transport."]


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeOpenAI]:
    monkeypatch.setenv(KEY_ENV, KEY)
    server = await FakeOpenAI().start()
    yield server
    await server.close()


async def model_session(client: ACPClient, fake: FakeOpenAI) -> str:
    spec = {"provider": "openai", "model": "fake-model", "base_url": fake.base_url, "api_key_env": KEY_ENV}
    await client.call("actor.add", name="model", spec=spec)
    made = await client.call("session.create", title="model", orchestrator="model")
    assert isinstance(made, session_pb2.CreateSessionResponse)
    return made.session.meta.id


def held(release: asyncio.Event, after: int) -> Stream:
    """The pieces as a stream that stops after ``after`` chunks until ``release`` is set."""
    answer = turn("".join(PIECES), pieces=len(PIECES))
    answer.hold, answer.hold_after = release, after
    return answer


async def test_a_streamed_turn_appears_piece_by_piece(client: ACPClient, fake: FakeOpenAI) -> None:
    await model_session(client, fake)
    release = asyncio.Event()
    # The role chunk, then two pieces of text; the rest waits for the test.
    fake.then(held(release, 3))
    app = app_on(client)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SessionScreen))
        screen = app.screen
        assert isinstance(screen, SessionScreen)
        await pilot.press(*"are the tests green?", "enter")
        await until(pilot, lambda: screen_text(app, "#live").strip() == "The tests are green")
        assert "running" in screen_text(app, "#turn")
        assert len(screen.messages) == 1  # the question; no reply stored yet
        release.set()
        await until(pilot, lambda: len(screen.messages) == 2)
        await until(pilot, lambda: screen_text(app, "#live").strip() == "")
        lines = "\n".join(line.text for line in screen.query_one("#history", RichLog).lines)
        assert "".join(PIECES) in lines
        await until(pilot, lambda: screen_text(app, "#turn").strip() == "")
        assert fake.requests[0].body["messages"][-1]["content"] == "are the tests green?"


async def test_a_running_turn_is_cancelled_and_what_is_typed_is_kept(
    client: ACPClient, fake: FakeOpenAI
) -> None:
    session_id = await model_session(client, fake)
    release = asyncio.Event()
    fake.then(held(release, 2))
    app = app_on(client)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SessionScreen))
        screen = app.screen
        assert isinstance(screen, SessionScreen)
        await pilot.press(*"first", "enter")
        await until(pilot, lambda: "running" in screen_text(app, "#turn"))
        # The reject policy refuses a tell while a turn runs: the text stays in the prompt.
        screen.query_one("#multitask", Select).value = "reject"
        await pilot.press(*"second", "enter")
        await settle(pilot)
        assert screen.query_one("#prompt", Input).value == "second"
        await pilot.press("ctrl+t")
        await until(pilot, lambda: screen_text(app, "#turn").strip() == "")
        shown = await client.call("session.show", session_id=session_id)
        assert isinstance(shown, session_pb2.GetSessionResponse)
        assert [turn.state for turn in shown.turns] == [session_pb2.TURN_STATE_CANCELLED]
        release.set()
