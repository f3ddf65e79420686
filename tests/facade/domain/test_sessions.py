"""session.* through the local client over a real SQLite file: lifecycle, listing, tell."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import events_pb2, session_pb2
from tests.facade.domain.session_helpers import add_project, create, error_of, tell

ACTIVE = session_pb2.SESSION_STATE_ACTIVE
CLOSED = session_pb2.SESSION_STATE_CLOSED


async def test_create_defaults_and_show(client: ACPClient) -> None:
    session = await create(client, title="first", labels={"team": "a"})
    assert session.orchestrator == "orchestrator"
    assert session.meta.namespace == "default"
    assert session.state == ACTIVE
    assert session.message_count == 0
    assert len(session.meta.id) == 26
    shown = await client.call("session.show", session_id=session.meta.id)
    assert isinstance(shown, session_pb2.GetSessionResponse)
    assert shown.session == session
    assert list(shown.messages) == []


async def test_create_checks_orchestrator_and_project(client: ACPClient, tmp_path: pathlib.Path) -> None:
    err = await error_of(client, "session.create", orchestrator="nobody")
    assert (err.code, err.details["field"]) == ("INVALID_PARAMS", "orchestrator")
    err = await error_of(client, "session.create", project="nowhere")
    assert (err.code, err.details["field"]) == ("INVALID_PARAMS", "project")
    err = await error_of(client, "session.create", title="x" * 1001)
    assert (err.code, err.details["field"]) == ("INVALID_PARAMS", "title")
    err = await error_of(client, "session.create", labels={"bad key": "v"})
    assert (err.code, err.details["field"]) == ("INVALID_PARAMS", "labels.bad key")
    err = await error_of(client, "session.create", labels={"k": "v" * 257})
    assert (err.code, err.details["field"]) == ("INVALID_PARAMS", "labels.k")
    await add_project(client, "web", tmp_path / "web")
    session = await create(client, project="web", orchestrator="scripted")
    assert (session.project, session.orchestrator) == ("web", "scripted")


async def test_unknown_session_is_not_found(client: ACPClient) -> None:
    cases: list[tuple[str, dict[str, Any]]] = [
        ("session.show", {}),
        ("session.delete", {}),
        ("session.resume", {}),
        ("session.export", {}),
        ("session.tell", {"content": "hi"}),
    ]
    for operation, extra in cases:
        err = await error_of(client, operation, session_id="01HZZZZZZZZZZZZZZZZZZZZZZZ", **extra)
        assert err.code == "NOT_FOUND", operation
        assert err.details["refinement"] == "SESSION_NOT_FOUND"


async def test_tell_help_actions_and_free_text(client: ACPClient) -> None:
    session = await create(client)
    sid = session.meta.id
    told = await tell(client, sid, "/help")
    assert told.message.role == session_pb2.MESSAGE_ROLE_USER
    assert (told.message.index, told.message.content) == (0, "/help")
    assert [r.index for r in told.replies] == [1]
    assert told.replies[0].role == session_pb2.MESSAGE_ROLE_ORCHESTRATOR
    for command in ("/help", "/actions", "/use", "/close"):
        assert command in told.replies[0].content

    empty = await tell(client, sid, "/actions")
    assert "No actions are registered in namespace 'default'" in empty.replies[0].content
    await client.call(
        "action.add",
        name="bump",
        description="Bump the version",
        spec={"actor": "scripted", "steps": []},
    )
    await client.call("action.add", name="alpha", spec={"actor": "scripted", "steps": []})
    listed = (await tell(client, sid, "  /actions  ")).replies[0].content
    assert "  - alpha\n  - bump: Bump the version" in listed

    chat = (await tell(client, sid, "please fix my code")).replies[0].content
    assert "do not interpret free text" in chat
    for command in ("/actions", "/use", "/close"):
        assert command in chat
    unknown = (await tell(client, sid, "/frobnicate now")).replies[0].content
    assert unknown.startswith("Unknown command /frobnicate.")

    shown = await client.call("session.show", session_id=sid)
    assert isinstance(shown, session_pb2.GetSessionResponse)
    assert shown.session.message_count == 10
    assert [m.index for m in shown.messages] == list(range(10))
    assert [m.content for m in shown.messages][0::2] == [
        "/help",
        "/actions",
        "  /actions  ",
        "please fix my code",
        "/frobnicate now",
    ]
    assert len({m.id for m in shown.messages}) == 10


async def test_tell_validates_content(client: ACPClient) -> None:
    session = await create(client)
    err = await error_of(client, "session.tell", session_id=session.meta.id, content="")
    assert err.code == "INVALID_PARAMS"
    err = await error_of(client, "session.tell", session_id=session.meta.id, content="x" * 100_001)
    assert (err.code, err.details["field"]) == ("INVALID_PARAMS", "content")


async def test_close_refuses_tell_and_resume_reopens(client: ACPClient) -> None:
    session = await create(client)
    sid = session.meta.id
    err = await error_of(client, "session.resume", session_id=sid)
    assert (err.code, err.details["state"]) == ("INVALID_STATE", "active")

    closing = await tell(client, sid, "/close")
    assert "closed" in closing.replies[0].content
    shown = await client.call("session.show", session_id=sid)
    assert isinstance(shown, session_pb2.GetSessionResponse)
    assert shown.session.state == CLOSED
    assert shown.session.message_count == 2

    err = await error_of(client, "session.tell", session_id=sid, content="/help")
    assert err.code == "INVALID_STATE"
    assert "session.resume" in err.message
    resumed = await client.call("session.resume", session_id=sid)
    assert isinstance(resumed, session_pb2.ResumeSessionResponse)
    assert resumed.session.state == ACTIVE
    assert resumed.session.meta.update_time.ToNanoseconds() >= shown.session.meta.update_time.ToNanoseconds()
    again = await tell(client, sid, "/help")
    assert again.message.index == 2


async def test_tell_needs_an_orchestrating_provider(client: ACPClient) -> None:
    session = await create(client, orchestrator="scripted")
    err = await error_of(client, "session.tell", session_id=session.meta.id, content="/help")
    assert err.code == "INVALID_STATE"
    assert err.details["provider"] == "scripted"
    assert err.details["orchestrating_providers"] == ["openai", "orchestrator"]
    shown = await client.call("session.show", session_id=session.meta.id)
    assert isinstance(shown, session_pb2.GetSessionResponse)
    assert shown.session.message_count == 0


async def test_delete_removes_session_messages_and_context(client: ACPClient) -> None:
    await client.call("skill.add", name="tone", spec={"instructions": "Be brief."})
    session = await create(client)
    sid = session.meta.id
    await tell(client, sid, "/help")
    await client.call("context.set", session_id=sid, config={"skills": ["tone"]})
    deleted = await client.call("session.delete", session_id=sid)
    assert isinstance(deleted, session_pb2.DeleteSessionResponse)
    assert deleted.session_id == sid
    assert (await error_of(client, "session.show", session_id=sid)).code == "NOT_FOUND"
    assert (await error_of(client, "context.show", session_id=sid)).code == "NOT_FOUND"
    assert (await error_of(client, "session.delete", session_id=sid)).code == "NOT_FOUND"


async def test_each_message_is_one_session_message_event(client: ACPClient) -> None:
    session = await create(client)
    other = await create(client)
    sid = session.meta.id
    received: list[events_pb2.Event] = []

    async def follow() -> None:
        async for event in client.subscribe(session_id=sid, event_type=["session.message"]):
            received.append(event)
            if len(received) == 4:
                return

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0)
    first = await tell(client, sid, "/help")
    await tell(client, other.meta.id, "/help")
    second = await tell(client, sid, "hello")
    await asyncio.wait_for(follower, timeout=10)
    assert [e.type for e in received] == ["session.message"] * 4
    assert {e.session_id for e in received} == {sid}
    assert {e.namespace for e in received} == {"default"}
    assert [e.session_message.message for e in received] == [
        first.message,
        *first.replies,
        second.message,
        *second.replies,
    ]
    sequences = [e.sequence for e in received]
    assert sequences == sorted(sequences)


async def _names(client: ACPClient, **filters: Any) -> list[str]:
    """Every session title of a listing, following page tokens."""
    titles: list[str] = []
    token = ""
    for _ in range(100):
        page = await client.call("session.list", page_token=token, **filters)
        assert isinstance(page, session_pb2.ListSessionsResponse)
        titles.extend(s.title for s in page.sessions)
        token = page.next_page_token
        if not token:
            return titles
    raise AssertionError("pagination did not end")


async def test_list_newest_first_paginated(client: ACPClient) -> None:
    for i in range(7):
        await create(client, title=f"s{i}")
    everything = await client.call("session.list")
    assert isinstance(everything, session_pb2.ListSessionsResponse)
    assert [s.title for s in everything.sessions] == [f"s{i}" for i in reversed(range(7))]
    assert everything.next_page_token == ""
    first = await client.call("session.list", page_size=3)
    assert isinstance(first, session_pb2.ListSessionsResponse)
    assert [s.title for s in first.sessions] == ["s6", "s5", "s4"]
    assert first.next_page_token
    assert await _names(client, page_size=3) == [f"s{i}" for i in reversed(range(7))]
    assert await _names(client, page_size=7) == [f"s{i}" for i in reversed(range(7))]
    # A session created between pages does not disturb the pages after the token.
    await create(client, title="late")
    second = await client.call("session.list", page_size=3, page_token=first.next_page_token)
    assert isinstance(second, session_pb2.ListSessionsResponse)
    assert [s.title for s in second.sessions] == ["s3", "s2", "s1"]


async def test_list_page_size_rules(client: ACPClient) -> None:
    for i in range(3):
        await create(client, title=f"s{i}")
    err = await error_of(client, "session.list", page_size=-1)
    assert (err.code, err.details["field"]) == ("INVALID_PARAMS", "page_size")
    clamped = await client.call("session.list", page_size=100_000)
    assert isinstance(clamped, session_pb2.ListSessionsResponse)
    assert len(clamped.sessions) == 3


async def test_list_filters(client: ACPClient, tmp_path: pathlib.Path) -> None:
    await add_project(client, "web", tmp_path / "web")
    a = await create(client, title="a", project="web")
    await create(client, title="b", orchestrator="scripted")
    c = await create(client, title="c", project="web")
    await tell(client, c.meta.id, "/close")
    await add_project(client, "web", tmp_path / "web", namespace="other")
    await create(client, title="d", namespace="other", project="web")
    assert await _names(client) == ["d", "c", "b", "a"]
    assert await _names(client, namespace="default") == ["c", "b", "a"]
    assert await _names(client, namespace="other") == ["d"]
    assert await _names(client, project="web") == ["d", "c", "a"]
    assert await _names(client, project="web", namespace="default") == ["c", "a"]
    assert await _names(client, actor="scripted") == ["b"]
    assert await _names(client, actor="orchestrator", state="SESSION_STATE_ACTIVE") == ["d", "a"]
    assert await _names(client, state="SESSION_STATE_CLOSED") == ["c"]
    assert await _names(client, project="nope") == []
    assert a.meta.id


async def test_list_refuses_forged_and_foreign_tokens(client: ACPClient) -> None:
    for i in range(4):
        await create(client, title=f"s{i}", project="")
    page = await client.call("session.list", page_size=2)
    assert isinstance(page, session_pb2.ListSessionsResponse)
    token = page.next_page_token
    for forged in ["garbage", token[:-2] + ("AA" if not token.endswith("AA") else "BB"), "e30", token + "x"]:
        err = await error_of(client, "session.list", page_size=2, page_token=forged)
        assert (err.code, err.details["field"]) == ("INVALID_PARAMS", "page_token"), forged
    # A token belongs to its filters: replayed against other ones it is stale.
    for other in [{"namespace": "default"}, {"actor": "orchestrator"}, {"state": "SESSION_STATE_ACTIVE"}]:
        err = await error_of(client, "session.list", page_size=2, page_token=token, **other)
        assert err.code == "INVALID_PARAMS", other
    # Page size may change between pages; the filters may not.
    rest = await client.call("session.list", page_size=10, page_token=token)
    assert isinstance(rest, session_pb2.ListSessionsResponse)
    assert [s.title for s in rest.sessions] == ["s1", "s0"]


async def test_create_racing_its_actors_removal_never_leaves_a_dangling_session(
    client: ACPClient,
) -> None:
    """The stored actor is looked up in the create's own write transaction: whatever the
    interleaving, either the removal was refused (by the sessions that got in first) or
    every create after it was refused; never a session naming a removed actor."""
    for round_ in range(5):
        name = f"boss{round_}"
        await client.call("actor.add", name=name, spec={"provider": "scripted"})

        async def outcome(operation: str, **fields: Any) -> str:
            try:
                await client.call(operation, **fields)
            except ACPError as err:
                return err.code
            return "OK"

        calls = [outcome("session.create", orchestrator=name) for _ in range(4)]
        calls.insert(round_ % 5, outcome("actor.remove", name=name))
        results = await asyncio.gather(*calls)
        removed = results.pop(round_ % 5)
        listed = await client.call("session.list", actor=name)
        assert isinstance(listed, session_pb2.ListSessionsResponse)
        assert len(listed.sessions) == results.count("OK")
        if removed == "OK":
            assert set(results) == {"INVALID_PARAMS"}, results
        else:
            assert removed == "INVALID_STATE"
            assert "OK" in results
        assert set(results) <= {"OK", "INVALID_PARAMS"}


async def test_sessions_block_removing_their_actor_and_project(
    client: ACPClient, tmp_path: pathlib.Path
) -> None:
    await add_project(client, "web", tmp_path / "web")
    await client.call("actor.add", name="boss", spec={"provider": "scripted"})
    session = await create(client, orchestrator="boss", project="web")
    for kind, name in [("actor", "boss"), ("project", "web")]:
        err = await error_of(client, f"{kind}.remove", name=name)
        assert err.code == "INVALID_STATE", kind
        assert err.details["referrers"] == [f"session/{session.meta.id}"]
    await client.call("session.delete", session_id=session.meta.id)
    await client.call("actor.remove", name="boss")
    await client.call("project.remove", name="web")
