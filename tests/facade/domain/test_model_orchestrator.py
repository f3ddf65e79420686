"""A session whose orchestrator is a model (provider ``openai``), against the fake server:
a streamed reply that starts a plan, slash commands, the history within the budget, errors."""

from __future__ import annotations

import asyncio
import json
import pathlib
from collections.abc import AsyncIterator

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import plan_pb2, session_pb2
from tests.conformance.test_turns import held
from tests.facade.plans.helpers import plan_events, wait_for
from tests.facade.plans.model_world import KEY, KEY_ENV, model_world
from tests.fake_openai import FakeOpenAI, error, eventually, turn


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


@pytest.fixture
async def client(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, fake: FakeOpenAI
) -> AsyncIterator[ACPClient]:
    monkeypatch.setenv(KEY_ENV, KEY)
    facade = open_facade(tmp_path / "acp.db")
    acp = ACPClient(LocalTransport(facade))
    await model_world(acp, tmp_path / "project", fake.base_url)
    await acp.call(
        "actor.add",
        name="chat",
        spec={"provider": "openai", "model": "fake-model", "base_url": fake.base_url, "api_key_env": KEY_ENV},
    )
    yield acp
    await acp.close()
    await facade.close()


async def session_of(client: ACPClient, **fields: object) -> str:
    response = await client.call("session.create", {"project": "proj", "orchestrator": "chat", **fields})
    assert isinstance(response, session_pb2.CreateSessionResponse)
    return response.session.meta.id


async def tell(client: ACPClient, session_id: str, content: str) -> session_pb2.TellSessionResponse:
    response = await client.call("session.tell", session_id=session_id, content=content)
    assert isinstance(response, session_pb2.TellSessionResponse)
    return response


async def test_a_streamed_reply_starts_a_plan(client: ACPClient, fake: FakeOpenAI) -> None:
    fake.then(
        turn(
            "Sure, I will start that now.",
            [("start_plan", {"action": "act", "inputs": {"word": "old"}, "reason": "asked"})],
        ),
        turn("The plan is running; follow it with plan.status."),
    )
    session_id = await session_of(client)
    response = await tell(client, session_id, "please rename old")
    contents = [r.content for r in response.replies]
    assert contents[0] == "Sure, I will start that now."
    assert contents[1].startswith("Started plan ")
    assert contents[2] == "The plan is running; follow it with plan.status."
    plan_id = response.replies[1].plan_id
    assert plan_id
    status = await client.call("plan.status", plan_id=plan_id)
    assert isinstance(status, plan_pb2.GetPlanStatusResponse)
    assert status.plan.session_id == session_id
    assert status.plan.action == "act"

    first = fake.requests[0].body
    assert first["messages"][0]["role"] == "system"
    assert "start_plan" in first["messages"][0]["content"]
    assert first["messages"][-1] == {"role": "user", "content": "please rename old"}
    (tool,) = first["tools"]
    assert tool["function"]["name"] == "start_plan"
    assert tool["function"]["parameters"]["properties"]["action"]["enum"] == ["act"]
    answer = json.loads(fake.requests[1].body["messages"][-1]["content"])
    assert answer["plan_id"] == plan_id

    events = await plan_events(client, "")
    of_session = [e for e in events if e.session_id == session_id]
    deltas = [e for e in of_session if e.type == "session.text_delta"]
    assert {e.session_text_delta.actor for e in deltas} == {"chat"}
    streamed = {1: "", 2: ""}
    for event in deltas:
        streamed[event.session_text_delta.turn] += event.session_text_delta.text
    assert streamed == {1: contents[0], 2: contents[2]}
    messages = [e for e in of_session if e.type == "session.message"]
    # The user's message, the deltas, then the replies.
    assert messages[0].sequence < deltas[0].sequence < deltas[-1].sequence < messages[1].sequence
    await wait_for(client, plan_id, plan_pb2.PLAN_STATE_PENDING)


async def test_slash_commands_never_reach_the_model(client: ACPClient, fake: FakeOpenAI) -> None:
    session_id = await session_of(client)
    help_reply = await tell(client, session_id, "/help")
    assert "/actions" in help_reply.replies[0].content
    actions = await tell(client, session_id, "/actions")
    assert "act" in actions.replies[0].content
    used = await tell(client, session_id, "/use act word=old")
    assert used.replies[0].plan_id
    assert fake.requests == []


async def test_the_history_is_cut_to_the_budget_newest_first(client: ACPClient, fake: FakeOpenAI) -> None:
    session_id = await session_of(client)
    await client.call("context.set", session_id=session_id, config={"token_budget": 300})
    fake.repeat = turn("ok")
    for index in range(6):
        await tell(client, session_id, f"message {index} " + "x" * 200)
    last = fake.requests[-1].body["messages"]
    assert last[0]["role"] == "system"
    assert last[-1]["content"].startswith("message 5 ")
    assert len(last) < 12
    assert all(not m["content"].startswith("message 0 ") for m in last[1:])


async def test_a_model_failure_is_a_clear_error(
    client: ACPClient, fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id = await session_of(client)
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ACPError) as info:
        await tell(client, session_id, "hello")
    assert info.value.code == "INVALID_STATE"
    assert info.value.details["refinement"] == "MODEL_KEY_MISSING"
    assert KEY_ENV in info.value.message
    monkeypatch.setenv(KEY_ENV, KEY)
    fake.then(error(400, "context too long", kind="invalid_request_error"))
    with pytest.raises(ACPError) as refused:
        await tell(client, session_id, "hello again")
    assert refused.value.details["refinement"] == "MODEL_REQUEST_REFUSED"
    assert "context too long" in refused.value.message


async def test_a_failed_start_is_told_to_the_model(client: ACPClient, fake: FakeOpenAI) -> None:
    fake.then(turn("", [("start_plan", {"action": "nope"})]), turn("That action does not exist."))
    session_id = await session_of(client)
    response = await tell(client, session_id, "run nope")
    assert "Could not start a plan from action 'nope'" in response.replies[0].content
    answer = json.loads(fake.requests[1].body["messages"][-1]["content"])
    assert answer["error"]["code"] == "NOT_FOUND"
    assert response.replies[-1].content == "That action does not exist."


async def test_a_session_without_a_project_offers_no_tool(client: ACPClient, fake: FakeOpenAI) -> None:
    response = await client.call("session.create", orchestrator="chat")
    assert isinstance(response, session_pb2.CreateSessionResponse)
    fake.then(turn("Hello!"))
    await tell(client, response.session.meta.id, "hi")
    assert "tools" not in fake.requests[0].body


@pytest.mark.parametrize("cancel_plans", [False, True])
async def test_cancelling_a_turn_leaves_its_plans_alone_unless_asked(
    client: ACPClient, fake: FakeOpenAI, cancel_plans: bool
) -> None:
    """session.cancel_turn of a turn that started a plan and is still answering: the turn
    ends cancelled naming the plan; the plan keeps its state unless ``cancel_plans``."""
    fake.then(
        turn("Starting.", [("start_plan", {"action": "act", "inputs": {"word": "old"}, "reason": "asked"})]),
        held("Never finished.", asyncio.Event()),
    )
    session_id = await session_of(client)
    started = await client.call("session.tell", session_id=session_id, content="rename old", background=True)
    assert isinstance(started, session_pb2.TellSessionResponse)
    # The plan is started and the model's answer to its result is in flight.
    await eventually(lambda: len(fake.requests) == 2)
    cancelled = await client.call(
        "session.cancel_turn", session_id=session_id, turn_id=started.turn.id, cancel_plans=cancel_plans
    )
    assert isinstance(cancelled, session_pb2.CancelTurnResponse)
    assert cancelled.turn.state == session_pb2.TURN_STATE_CANCELLED
    (plan_id,) = cancelled.turn.plan_ids
    status = await client.call("plan.status", plan_id=plan_id)
    assert isinstance(status, plan_pb2.GetPlanStatusResponse)
    expected = plan_pb2.PLAN_STATE_CANCELLED if cancel_plans else plan_pb2.PLAN_STATE_PENDING
    assert status.plan.state == expected
    assert status.plan.session_id == session_id
