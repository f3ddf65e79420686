"""Text deltas of a model actor (``plan.text_delta``) and a model orchestrator
(``session.text_delta``) reach subscribers on every transport, in order and as stored, inside
the tell's turn (``session.turn_started`` ... ``session.turn_completed``, ACP 1.3). A subscriber
speaking ACP 1.2 gets the same stream without the turn events, one speaking 1.1 without the
deltas too; asking by name for an event type newer than the subscriber is VERSION_MISMATCH."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator

import pytest

from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import events_pb2, plan_pb2, session_pb2
from tests.conformance.backends import KINDS, open_backend
from tests.facade.plans.model_world import KEY, KEY_ENV, model_world
from tests.fake_openai import FakeOpenAI, turn
from tests.server_process import Tokens

DELTAS = {"plan.text_delta", "session.text_delta"}
TURNS = {"session.turn_started", "session.turn_completed"}
SESSION_TEXT = "Hello there, I am the model orchestrator."
PLAN_TEXT = "Nothing needs changing in this project."


def executed(event: events_pb2.Event) -> bool:
    change = event.plan_state_changed
    return (
        event.type == "plan.state_changed"
        and change.phase == plan_pb2.PLAN_PHASE_EXECUTE
        and change.to_state == plan_pb2.PLAN_STATE_SUCCEEDED
    )


async def until(
    stream: AsyncIterator[events_pb2.Event], done: object, seconds: float = 30
) -> list[events_pb2.Event]:
    found: list[events_pb2.Event] = []
    async with asyncio.timeout(seconds):
        while not found or not done(found[-1]):  # type: ignore[operator]
            found.append(await anext(stream))
    return found


def joined(events: list[events_pb2.Event], kind: str) -> str:
    field = kind.replace(".", "_", 1)
    return "".join(getattr(e, field).text for e in events if e.type == kind)


@pytest.mark.parametrize("kind", KINDS)
async def test_deltas_on_every_transport_and_none_for_a_1_1_subscriber(
    kind: str, tmp_path: pathlib.Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)
    async with FakeOpenAI() as fake, open_backend(kind, tmp_path, tokens) as backend:
        alice = backend.client()
        older = backend.client(acp_version="1.1")
        middle = backend.client(acp_version="1.2")
        await model_world(alice, backend.root / "project", fake.base_url)
        await alice.call(
            "actor.add",
            name="chat",
            spec={"provider": "openai", "model": "m", "base_url": fake.base_url, "api_key_env": KEY_ENV},
        )
        created = await alice.call("session.create", project="proj", orchestrator="chat")
        session_id = created.session.meta.id  # type: ignore[attr-defined]

        with pytest.raises(ACPError) as refused:
            await anext(aiter(older.subscribe(event_type=["plan.text_delta"])))
        assert refused.value.code == "VERSION_MISMATCH"
        assert refused.value.details["event_type"] == "plan.text_delta"
        with pytest.raises(ACPError) as refused:
            await anext(aiter(middle.subscribe(event_type=["session.turn_started"])))
        assert refused.value.code == "VERSION_MISMATCH"
        assert refused.value.details["event_type"] == "session.turn_started"

        current = aiter(alice.subscribe(session_id=session_id))
        between = aiter(middle.subscribe(session_id=session_id))
        previous = aiter(older.subscribe(session_id=session_id))
        await alice.call("session.tell", session_id=session_id, content="/help")
        # Each is attached once it has read the /help exchange: its turn for 1.3, the two
        # messages alone before it.
        assert [e.type for e in await until(current, lambda e: e.type == "session.turn_completed")] == [
            "session.turn_started",
            "session.message",
            "session.message",
            "session.turn_completed",
        ]
        for stream in (between, previous):
            assert [
                e.type
                for e in await until(
                    stream, lambda e: e.type == "session.message" and e.session_message.message.index == 1
                )
            ] == ["session.message"] * 2

        fake.then(turn(SESSION_TEXT, pieces=5, delay=0.02), turn(PLAN_TEXT, pieces=4, delay=0.02))
        await alice.call("session.tell", session_id=session_id, content="hello")
        used = await alice.call(
            "plan.use", action="act", project="proj", inputs={"word": "x"}, session_id=session_id
        )
        plan_id = used.plan.meta.id  # type: ignore[attr-defined]
        await alice.call("plan.execute", plan_id=plan_id, wait=True)

        new = await until(current, executed)
        mid = await until(between, executed)
        old = await until(previous, executed)
        assert joined(new, "session.text_delta") == SESSION_TEXT
        assert joined(new, "plan.text_delta") == PLAN_TEXT
        deltas = [e for e in new if e.type in DELTAS]
        assert all(e.session_id == session_id for e in deltas)
        assert {e.plan_id for e in deltas if e.type == "plan.text_delta"} == {plan_id}
        assert [e.sequence for e in new] == sorted(e.sequence for e in new)
        # The model's tell is one turn: started, the user's message, the deltas, the reply,
        # completed; every delta names it.
        told = [e for e in new if e.type.startswith("session.")]
        assert [e.type for e in told] == [
            "session.turn_started",
            "session.message",
            *["session.text_delta"] * len([e for e in told if e.type == "session.text_delta"]),
            "session.message",
            "session.turn_completed",
        ], [e.type for e in told]
        turn_id = told[0].session_turn_started.turn.id
        assert turn_id
        assert told[-1].session_turn_completed.turn.id == turn_id
        assert told[-1].session_turn_completed.turn.state == session_pb2.TURN_STATE_SUCCEEDED
        assert {e.session_text_delta.turn_id for e in told if e.type == "session.text_delta"} == {turn_id}
        # The 1.2 subscriber gets everything but the turn events, the same events; the 1.1
        # one the deltas neither.
        assert not {e.type for e in mid} & TURNS
        assert [e.sequence for e in mid] == [e.sequence for e in new if e.type not in TURNS]
        assert not {e.type for e in old} & (DELTAS | TURNS)
        assert [e.sequence for e in old] == [e.sequence for e in new if e.type not in DELTAS | TURNS]
        # What was delivered live is what the log keeps: a resubscription reads the same.
        replay = aiter(alice.subscribe(session_id=session_id, event_type=sorted(DELTAS)))
        stored = await until(replay, lambda e: e.sequence == deltas[-1].sequence)
        assert [(e.sequence, e.type, e.SerializeToString()) for e in stored] == [
            (e.sequence, e.type, e.SerializeToString()) for e in deltas
        ]
        for stream in (current, between, previous, replay):
            await stream.aclose()  # type: ignore[attr-defined]
