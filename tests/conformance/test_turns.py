"""Double texting on every transport (issue 33): a second tell arrives while the first turn's
model call is in flight on the fake OpenAI server; for each multitask policy the stored
history, each model request's messages, the events and the turn states are as the policy
says. Then cancel during a streaming model turn, and bad input."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import events_pb2, session_pb2
from tests.conformance.backends import open_backend
from tests.facade.plans.model_world import KEY, KEY_ENV, model_world
from tests.fake_openai import FakeOpenAI, Stream, eventually, turn
from tests.server_process import Tokens

USER, ORCH = session_pb2.MESSAGE_ROLE_USER, session_pb2.MESSAGE_ROLE_ORCHESTRATOR
TURN_EVENTS = ["session.turn_started", "session.turn_completed", "session.message"]


def held(text: str, hold: asyncio.Event, after: int = 0) -> Stream:
    """``turn(text)`` held in flight: before its first chunk, or after ``after`` chunks."""
    answer = turn(text)
    answer.hold = hold
    answer.hold_after = after
    return answer


async def chat_session(client: ACPClient, fake: FakeOpenAI, root: pathlib.Path, **fields: Any) -> str:
    await model_world(client, root / "project", fake.base_url)
    await client.call(
        "actor.add",
        name="chat",
        spec={"provider": "openai", "model": "m", "base_url": fake.base_url, "api_key_env": KEY_ENV},
    )
    created = await client.call("session.create", project="proj", orchestrator="chat", **fields)
    assert isinstance(created, session_pb2.CreateSessionResponse)
    return created.session.meta.id


async def shown(client: ACPClient, session_id: str) -> session_pb2.GetSessionResponse:
    answer = await client.call("session.show", session_id=session_id)
    assert isinstance(answer, session_pb2.GetSessionResponse)
    return answer


def said(request_body: dict[str, Any]) -> list[tuple[str, str]]:
    """A model request's conversation after the system message."""
    return [(m["role"], m["content"]) for m in request_body["messages"][1:]]


async def ended(client: ACPClient, session_id: str, turn_id: str) -> session_pb2.Turn:
    """The turn once it has ended (background turns are read back with session.turn)."""
    for _ in range(1000):
        answer = await client.call("session.turn", session_id=session_id, turn_id=turn_id)
        assert isinstance(answer, session_pb2.GetTurnResponse)
        if answer.turn.state not in (session_pb2.TURN_STATE_QUEUED, session_pb2.TURN_STATE_RUNNING):
            return answer.turn
        await asyncio.sleep(0.02)
    raise AssertionError(f"turn {turn_id} never ended")


async def collect(stream: AsyncIterator[events_pb2.Event], count: int) -> list[events_pb2.Event]:
    found: list[events_pb2.Event] = []
    async with asyncio.timeout(30):
        while len(found) < count:
            found.append(await anext(stream))
    return found


def summary(events: list[events_pb2.Event]) -> list[tuple[str, str]]:
    """(type, what) per event: the turn state, or the message's role and content."""
    out = []
    for e in events:
        if e.type == "session.message":
            m = e.session_message.message
            out.append((e.type, f"{session_pb2.MessageRole.Name(m.role)}:{m.content}"))
        else:
            t = (
                e.session_turn_started.turn
                if e.type == "session.turn_started"
                else e.session_turn_completed.turn
            )
            out.append((e.type, session_pb2.TurnState.Name(t.state)))
    return out


POLICIES = ["enqueue", "reject", "interrupt", "rollback"]


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("kind", ["local", "http", "rest", "grpc"])
async def test_double_texting(
    kind: str, policy: str, tmp_path: pathlib.Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    release = asyncio.Event()
    async with FakeOpenAI() as fake, open_backend(kind, tmp_path, tokens) as backend:
        client = backend.client()
        sid = await chat_session(client, fake, backend.root)
        # The first answer streams one piece of "Answer one." and is held there.
        fake.then(held("Answer one.", release, after=2), turn("Answer two."))
        events = aiter(client.subscribe(session_id=sid, event_type=TURN_EVENTS))
        deltas = aiter(client.subscribe(session_id=sid, event_type=["session.text_delta"]))
        first = asyncio.ensure_future(client.call("session.tell", session_id=sid, content="Q1"))
        (delta,) = await collect(deltas, 1)
        assert delta.session_text_delta.text == "Answ"
        one_id = delta.session_text_delta.turn_id
        assert one_id

        multitask = f"MULTITASK_POLICY_{policy.upper()}"
        if policy == "reject":
            with pytest.raises(ACPError) as refused:
                await client.call("session.tell", session_id=sid, content="Q2", multitask=multitask)
            assert refused.value.code == "INVALID_STATE"
            assert refused.value.details["refinement"] == "TURN_IN_PROGRESS"
            assert refused.value.details["turn_id"] == one_id
            release.set()
            answer = await first
            assert isinstance(answer, session_pb2.TellSessionResponse)
            assert [r.content for r in answer.replies] == ["Answer one."]
            stored = (await shown(client, sid)).messages
            assert [(m.role, m.content) for m in stored] == [(USER, "Q1"), (ORCH, "Answer one.")]
            assert len(fake.requests) == 1
            return

        second = await client.call(
            "session.tell", session_id=sid, content="Q2", multitask=multitask, background=True
        )
        assert isinstance(second, session_pb2.TellSessionResponse)
        assert second.turn.state == session_pb2.TURN_STATE_QUEUED
        assert second.turn.background
        assert not second.replies
        two_id = second.turn.id
        if policy == "enqueue":
            release.set()
        answer = await first
        assert isinstance(answer, session_pb2.TellSessionResponse)
        assert answer.turn.id == one_id
        two = await ended(client, sid, two_id)
        one = answer.turn
        view = await shown(client, sid)
        history = [(m.role, m.content, m.partial) for m in view.messages]
        requests = [said(body) for body in fake.bodies()]
        assert len(requests) == 2
        if policy == "enqueue":
            assert one.state == session_pb2.TURN_STATE_SUCCEEDED
            assert history == [
                (USER, "Q1", False),
                (ORCH, "Answer one.", False),
                (USER, "Q2", False),
                (ORCH, "Answer two.", False),
            ]
            # The second model request sees the first turn whole.
            assert requests[1] == [("user", "Q1"), ("assistant", "Answer one."), ("user", "Q2")]
        elif policy == "interrupt":
            assert one.state == session_pb2.TURN_STATE_INTERRUPTED
            assert history == [
                (USER, "Q1", False),
                (ORCH, "Answ", True),
                (USER, "Q2", False),
                (ORCH, "Answer two.", False),
            ]
            assert requests[1] == [("user", "Q1"), ("assistant", "Answ"), ("user", "Q2")]
        else:
            assert one.state == session_pb2.TURN_STATE_CANCELLED
            assert history == [(USER, "Q2", False), (ORCH, "Answer two.", False)]
            assert requests[1] == [("user", "Q2")]
        assert requests[0] == [("user", "Q1")]
        assert two.state == session_pb2.TURN_STATE_SUCCEEDED
        # Every reply names its turn and the user's message it answers.
        by_id = {m.id: m for m in view.messages}
        for m in view.messages:
            if m.role == ORCH:
                assert by_id[m.in_reply_to].turn_id == m.turn_id
        assert [t.id for t in view.turns] == ([one_id, two_id] if policy != "rollback" else [two_id])
        if policy != "enqueue":
            # The interrupted model stream was closed: the fake server saw its connection end.
            await eventually(lambda: fake.dropped >= 1)

        seen = summary(await collect(events, 8 if policy != "rollback" else 7))
        final_one = session_pb2.TurnState.Name(one.state)
        if policy == "enqueue":
            assert seen == [
                ("session.turn_started", "TURN_STATE_RUNNING"),
                ("session.message", "MESSAGE_ROLE_USER:Q1"),
                ("session.message", "MESSAGE_ROLE_ORCHESTRATOR:Answer one."),
                ("session.turn_completed", "TURN_STATE_SUCCEEDED"),
                ("session.turn_started", "TURN_STATE_RUNNING"),
                ("session.message", "MESSAGE_ROLE_USER:Q2"),
                ("session.message", "MESSAGE_ROLE_ORCHESTRATOR:Answer two."),
                ("session.turn_completed", "TURN_STATE_SUCCEEDED"),
            ]
        else:
            head = [
                ("session.turn_started", "TURN_STATE_RUNNING"),
                ("session.message", "MESSAGE_ROLE_USER:Q1"),
            ]
            if policy == "interrupt":
                head.append(("session.message", "MESSAGE_ROLE_ORCHESTRATOR:Answ"))
            assert seen == [
                *head,
                ("session.turn_completed", final_one),
                ("session.turn_started", "TURN_STATE_RUNNING"),
                ("session.message", "MESSAGE_ROLE_USER:Q2"),
                ("session.message", "MESSAGE_ROLE_ORCHESTRATOR:Answer two."),
                ("session.turn_completed", "TURN_STATE_SUCCEEDED"),
            ]


@pytest.mark.parametrize("kind", ["local", "http", "rest", "grpc"])
async def test_cancel_during_a_streaming_model_turn(
    kind: str, tmp_path: pathlib.Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    release = asyncio.Event()
    async with FakeOpenAI() as fake, open_backend(kind, tmp_path, tokens) as backend:
        client = backend.client()
        sid = await chat_session(client, fake, backend.root)
        fake.then(held("Never finished.", release, after=2))
        deltas = aiter(client.subscribe(session_id=sid, event_type=["session.text_delta"]))
        started = await client.call("session.tell", session_id=sid, content="Q1", background=True)
        assert isinstance(started, session_pb2.TellSessionResponse)
        turn_id = started.turn.id
        await collect(deltas, 1)
        cancelled = await client.call("session.cancel_turn", session_id=sid, turn_id=turn_id)
        assert isinstance(cancelled, session_pb2.CancelTurnResponse)
        assert cancelled.turn.state == session_pb2.TURN_STATE_CANCELLED
        assert cancelled.turn.error.code == "cancelled"
        await eventually(lambda: fake.dropped == 1)
        release.set()
        history = (await shown(client, sid)).messages
        # No reply is stored after the cancel: the user's message alone.
        assert [(m.role, m.content) for m in history] == [(USER, "Q1")]
        got = await client.call("session.turn", session_id=sid, turn_id=turn_id)
        assert isinstance(got, session_pb2.GetTurnResponse)
        assert got.turn.state == session_pb2.TURN_STATE_CANCELLED
        assert not got.turn.reply_ids

        # Cancelling a finished turn: INVALID_STATE naming its state.
        with pytest.raises(ACPError) as refused:
            await client.call("session.cancel_turn", session_id=sid, turn_id=turn_id)
        assert refused.value.code == "INVALID_STATE"
        assert refused.value.details["refinement"] == "TURN_FINISHED"
        assert refused.value.details["state"] == "cancelled"
        with pytest.raises(ACPError) as missing:
            await client.call("session.turn", session_id=sid, turn_id="01J0000000000000000000000")
        assert missing.value.code == "NOT_FOUND"
        assert missing.value.details["refinement"] == "TURN_NOT_FOUND"


@pytest.mark.parametrize("kind", ["local", "http", "rest", "grpc"])
async def test_bad_input(
    kind: str, tmp_path: pathlib.Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    release = asyncio.Event()
    async with FakeOpenAI() as fake, open_backend(kind, tmp_path, tokens) as backend:
        client = backend.client()
        sid = await chat_session(client, fake, backend.root)
        # An unknown policy: INVALID_PARAMS (by name on JSON; by number on gRPC and locally).
        bad: object = "MULTITASK_POLICY_SOMETIMES" if kind in ("http", "rest") else 9
        with pytest.raises(ACPError) as unknown:
            await client.call("session.tell", session_id=sid, content="hi", multitask=bad)
        assert unknown.value.code == "INVALID_PARAMS"
        assert (await shown(client, sid)).messages == []

        # A tell queued behind a running turn, then the session is deleted: the queued tell
        # ends with SESSION_NOT_FOUND, nothing is left behind.
        fake.then(held("One.", release))
        first = asyncio.ensure_future(client.call("session.tell", session_id=sid, content="Q1"))
        await eventually(lambda: len(fake.requests) == 1)
        second = asyncio.ensure_future(client.call("session.tell", session_id=sid, content="Q2"))
        await asyncio.sleep(0.3)
        await client.call("session.delete", session_id=sid)
        with pytest.raises(ACPError) as gone:
            await second
        assert gone.value.code == "NOT_FOUND"
        assert gone.value.details["refinement"] == "SESSION_NOT_FOUND"
        release.set()
        await asyncio.gather(first, return_exceptions=True)
        with pytest.raises(ACPError):
            await client.call("session.show", session_id=sid)
        assert len(fake.requests) == 1
