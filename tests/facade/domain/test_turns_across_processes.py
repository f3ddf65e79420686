"""The multitask policy holds across processes: two facades (two stores, two turn runners,
as two ``--workers`` processes on one SQLite file or two replicas on one PostgreSQL schema),
the first tell reaching one and the second tell the other while the first turn's model
call is in flight on the fake OpenAI server."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import session_pb2
from tests.conformance.test_turns import chat_session, collect, ended, held, said, shown
from tests.facade.plans.model_world import KEY, KEY_ENV
from tests.fake_openai import FakeOpenAI, eventually, turn
from tests.postgres import fresh_schema

USER, ORCH = session_pb2.MESSAGE_ROLE_USER, session_pb2.MESSAGE_ROLE_ORCHESTRATOR


@pytest.fixture(params=["sqlite", "postgres"])
async def pair(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[ACPClient, ACPClient]]:
    monkeypatch.setenv(KEY_ENV, KEY)
    if request.param == "sqlite":
        where = str(tmp_path / "acp.db")
        schema = None
    else:
        schema = fresh_schema("turns")
        where = schema.__enter__()
    first = ACPClient(LocalTransport(open_facade(where), owns_facade=True))
    second = ACPClient(LocalTransport(open_facade(where), owns_facade=True))
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()
        if schema is not None:
            schema.__exit__(None, None, None)


@pytest.mark.parametrize("policy", ["enqueue", "reject", "interrupt", "rollback"])
async def test_double_texting_across_processes(
    pair: tuple[ACPClient, ACPClient], policy: str, tmp_path: pathlib.Path
) -> None:
    one_side, other_side = pair
    release = asyncio.Event()
    async with FakeOpenAI() as fake:
        sid = await chat_session(one_side, fake, tmp_path)
        fake.then(held("Answer one.", release, after=2), turn("Answer two."))
        deltas = aiter(one_side.subscribe(session_id=sid, event_type=["session.text_delta"]))
        first = asyncio.ensure_future(one_side.call("session.tell", session_id=sid, content="Q1"))
        # The first piece of the answer has reached the runner (its delta event is stored).
        (delta,) = await collect(deltas, 1)
        assert delta.session_text_delta.text == "Answ"
        multitask = f"MULTITASK_POLICY_{policy.upper()}"
        if policy == "reject":
            with pytest.raises(ACPError) as refused:
                await other_side.call("session.tell", session_id=sid, content="Q2", multitask=multitask)
            assert refused.value.details["refinement"] == "TURN_IN_PROGRESS"
            release.set()
            await first
            assert [m.content for m in (await shown(other_side, sid)).messages] == ["Q1", "Answer one."]
            return
        second = await other_side.call(
            "session.tell", session_id=sid, content="Q2", multitask=multitask, background=True
        )
        assert isinstance(second, session_pb2.TellSessionResponse)
        if policy == "enqueue":
            release.set()
        answer = await first
        assert isinstance(answer, session_pb2.TellSessionResponse)
        two = await ended(other_side, sid, second.turn.id)
        assert two.state == session_pb2.TURN_STATE_SUCCEEDED
        history = [(m.role, m.content) for m in (await shown(one_side, sid)).messages]
        requests = [said(body) for body in fake.bodies()]
        if policy == "enqueue":
            assert answer.turn.state == session_pb2.TURN_STATE_SUCCEEDED
            assert history == [(USER, "Q1"), (ORCH, "Answer one."), (USER, "Q2"), (ORCH, "Answer two.")]
            assert requests[1] == [("user", "Q1"), ("assistant", "Answer one."), ("user", "Q2")]
        elif policy == "interrupt":
            assert answer.turn.state == session_pb2.TURN_STATE_INTERRUPTED
            assert history == [(USER, "Q1"), (ORCH, "Answ"), (USER, "Q2"), (ORCH, "Answer two.")]
        else:
            assert answer.turn.state == session_pb2.TURN_STATE_CANCELLED
            assert history == [(USER, "Q2"), (ORCH, "Answer two.")]
            assert requests[1] == [("user", "Q2")]
        if policy != "enqueue":
            # The stop reached the other process's runner, which closed its model stream.
            await eventually(lambda: fake.dropped >= 1)


async def test_a_process_stopping_mid_turn_does_not_block_the_session(
    pair: tuple[ACPClient, ACPClient], tmp_path: pathlib.Path
) -> None:
    """The process running the first turn stops (closes) with it in flight: the other
    process's queued turn fails that turn (its runner is gone) and runs."""
    one_side, other_side = pair
    async with FakeOpenAI() as fake:
        sid = await chat_session(one_side, fake, tmp_path)
        fake.then(held("Never.", asyncio.Event()), turn("Answer two."))
        first = asyncio.ensure_future(one_side.call("session.tell", session_id=sid, content="Q1"))
        await eventually(lambda: len(fake.requests) == 1)
        second = await other_side.call("session.tell", session_id=sid, content="Q2", background=True)
        assert isinstance(second, session_pb2.TellSessionResponse)
        await one_side.close()
        await asyncio.gather(first, return_exceptions=True)
        two = await ended(other_side, sid, second.turn.id)
        assert two.state == session_pb2.TURN_STATE_SUCCEEDED
        view = await shown(other_side, sid)
        assert [(m.role, m.content) for m in view.messages] == [
            (USER, "Q1"),
            (USER, "Q2"),
            (ORCH, "Answer two."),
        ]
        one, _ = view.turns
        assert one.state == session_pb2.TURN_STATE_FAILED
        assert one.error.message == "the server process running it stopped"
