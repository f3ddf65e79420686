"""Text deltas of a model actor (``plan.text_delta``) and a model orchestrator
(``session.text_delta``) reach subscribers on every transport, in order and as stored; a
subscriber speaking ACP 1.1 gets the same stream without them, and asking for them by name is
VERSION_MISMATCH."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator

import pytest

from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import events_pb2, plan_pb2
from tests.conformance.backends import KINDS, open_backend
from tests.facade.plans.model_world import KEY, KEY_ENV, model_world
from tests.fake_openai import FakeOpenAI, turn
from tests.server_process import Tokens

DELTAS = {"plan.text_delta", "session.text_delta"}
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

        current = aiter(alice.subscribe(session_id=session_id))
        previous = aiter(older.subscribe(session_id=session_id))
        await alice.call("session.tell", session_id=session_id, content="/help")
        # Both are attached once they have read the /help exchange.
        for stream in (current, previous):
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
        old = await until(previous, executed)
        assert joined(new, "session.text_delta") == SESSION_TEXT
        assert joined(new, "plan.text_delta") == PLAN_TEXT
        deltas = [e for e in new if e.type in DELTAS]
        assert all(e.session_id == session_id for e in deltas)
        assert {e.plan_id for e in deltas if e.type == "plan.text_delta"} == {plan_id}
        assert [e.sequence for e in new] == sorted(e.sequence for e in new)
        # The 1.1 subscriber gets everything else, the same events.
        assert not {e.type for e in old} & DELTAS
        assert [e.sequence for e in old] == [e.sequence for e in new if e.type not in DELTAS]
        # What was delivered live is what the log keeps: a resubscription reads the same.
        replay = aiter(alice.subscribe(session_id=session_id, event_type=sorted(DELTAS)))
        stored = await until(replay, lambda e: e.sequence == deltas[-1].sequence)
        assert [(e.sequence, e.type, e.SerializeToString()) for e in stored] == [
            (e.sequence, e.type, e.SerializeToString()) for e in deltas
        ]
        for stream in (current, previous, replay):
            await stream.aclose()  # type: ignore[attr-defined]
