"""Revisions and expected revisions (ACP 1.3) in process, on SQLite and PostgreSQL: every
change moves a session's or plan's revision; a mutation naming a stale one is refused with
no effect; of two writers holding the same revision exactly one wins, each of 100 rounds."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.sessions import turns
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import events_pb2, plan_pb2, session_pb2
from tests.facade.plans import helpers

ROUNDS = 100
TELL_ROUNDS = 5


@pytest.fixture(params=["sqlite", "postgres"])
async def two(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path
) -> AsyncIterator[tuple[ACPClient, ACPClient]]:
    """Two clients, each over its own facade on one store (two processes' worth of writers)."""
    target: str | pathlib.Path = tmp_path / "acp.db"
    if request.param == "postgres":
        target = request.getfixturevalue("pg_url")
    first = ACPClient(LocalTransport(open_facade(target), owns_facade=True))
    second = ACPClient(LocalTransport(open_facade(target), owns_facade=True))
    yield first, second
    await first.close()
    await second.close()


async def _session(client: ACPClient, **fields: Any) -> session_pb2.Session:
    response = await client.call("session.create", title="t", **fields)
    assert isinstance(response, session_pb2.CreateSessionResponse)
    return response.session


async def _show(client: ACPClient, session_id: str) -> session_pb2.Session:
    response = await client.call("session.show", session_id=session_id)
    assert isinstance(response, session_pb2.GetSessionResponse)
    return response.session


async def _outcomes(*calls: asyncio.Future[object] | object) -> list[object]:
    return list(await asyncio.gather(*calls, return_exceptions=True))  # type: ignore[arg-type]


async def test_every_change_moves_the_revision_and_reads_carry_it(client: ACPClient) -> None:
    session = await _session(client)
    assert session.revision == 1
    assert (await _show(client, session.meta.id)).revision == 1
    updated = await client.call(
        "session.update",
        session_id=session.meta.id,
        session={"title": "new", "labels": {"team": "a"}},
        update_mask="title,labels",
    )
    assert isinstance(updated, session_pb2.UpdateSessionResponse)
    assert (updated.session.revision, updated.session.title, dict(updated.session.labels)) == (
        2,
        "new",
        {"team": "a"},
    )
    # A tell stores the user's message, then the replies: two changes.
    await client.call("session.tell", session_id=session.meta.id, content="hello")
    shown = await _show(client, session.meta.id)
    assert shown.revision == 4
    listed = await client.call("session.list")
    assert isinstance(listed, session_pb2.ListSessionsResponse)
    assert [s.revision for s in listed.sessions] == [4]
    # Labels are replaced whole; the event names the fields and carries the session.
    again = await client.call(
        "session.update", session_id=session.meta.id, session={"labels": {"b": "c"}}, update_mask="labels"
    )
    assert isinstance(again, session_pb2.UpdateSessionResponse)
    assert dict(again.session.labels) == {"b": "c"}
    events = []
    async for event in client.subscribe(session_id=session.meta.id, event_type=["session.updated"]):
        events.append(event)
        if len(events) == 2:
            break
    assert [list(e.session_updated.fields) for e in events] == [["title", "labels"], ["labels"]]
    assert [e.session_updated.session.revision for e in events] == [2, 5]


async def test_a_stale_revision_changes_nothing(client: ACPClient) -> None:
    session = await _session(client)
    await client.call(
        "session.update", session_id=session.meta.id, session={"title": "a"}, update_mask="title"
    )
    with pytest.raises(ACPError) as refused:
        await client.call(
            "session.update",
            session_id=session.meta.id,
            session={"title": "b"},
            update_mask="title",
            if_revision=1,
        )
    assert refused.value.code == "INVALID_STATE"
    assert refused.value.details == {
        "session_id": session.meta.id,
        "expected": 1,
        "actual": 2,
        "refinement": "REVISION_MISMATCH",
    }
    with pytest.raises(ACPError, match=r"not the expected revision"):
        await client.call("session.delete", session_id=session.meta.id, if_revision=1)
    shown = await _show(client, session.meta.id)
    assert (shown.title, shown.revision) == ("a", 2)
    await client.call("session.delete", session_id=session.meta.id, if_revision=2)
    with pytest.raises(ACPError) as gone:
        await _show(client, session.meta.id)
    assert gone.value.code == "NOT_FOUND"


async def test_bad_expected_revisions_are_clear_errors(client: ACPClient) -> None:
    session = await _session(client)
    other = await _session(client)
    await client.call("session.update", session_id=other.meta.id, session={"title": "x"}, update_mask="title")
    # A revision read from another session (other is at 2, this one at 1).
    with pytest.raises(ACPError) as mixed:
        await client.call(
            "session.update",
            session_id=session.meta.id,
            session={"title": "y"},
            update_mask="title",
            if_revision=2,
        )
    assert mixed.value.details["refinement"] == "REVISION_MISMATCH"
    assert (mixed.value.details["expected"], mixed.value.details["actual"]) == (2, 1)
    # On a read, and on a mutation of no single session or plan: INVALID_PARAMS.
    reads: list[tuple[str, dict[str, Any]]] = [
        ("session.show", {"session_id": session.meta.id}),
        ("session.list", {}),
    ]
    for operation, params in reads:
        with pytest.raises(ACPError) as read:
            await client.call(operation, params, if_revision=1)
        assert read.value.code == "INVALID_PARAMS"
        assert read.value.details["field"] == "if_revision"
    for bad in (0, -3):
        with pytest.raises(ACPError) as wrong:
            await client.call("session.delete", session_id=session.meta.id, if_revision=bad)
        assert wrong.value.code in ("INVALID_PARAMS", "INVALID_STATE")
    # An older client may not name one.
    old = ACPClient(client.transport, acp_version="1.2")
    with pytest.raises(ACPError) as older:
        await old.call("session.resume", session_id=session.meta.id, if_revision=1)
    assert older.value.code == "INVALID_PARAMS"


async def test_update_checks_what_create_checks(client: ACPClient) -> None:
    session = await _session(client)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"session": {}, "update_mask": ""}, "update_mask"),
        ({"session": {"state": "SESSION_STATE_CLOSED"}, "update_mask": "state"}, "update_mask"),
        ({"session": {"project": "nope"}, "update_mask": "project"}, "session.project"),
        (
            {"session": {"automation_profile": "nope"}, "update_mask": "automationProfile"},
            "session.automation_profile",
        ),
        ({"session": {"title": "x" * 1001}, "update_mask": "title"}, "session.title"),
        ({"session": {"labels": {"bad key!": "v"}}, "update_mask": "labels"}, "session.labels.bad key!"),
    ]
    for params, field in cases:
        with pytest.raises(ACPError) as refused:
            await client.call("session.update", {"session_id": session.meta.id, **params})
        assert (refused.value.code, refused.value.details.get("field")) == ("INVALID_PARAMS", field)
    assert (await _show(client, session.meta.id)).revision == 1
    with pytest.raises(ACPError) as unknown:
        await client.call("session.create", automation_profile="nope")
    assert unknown.value.details.get("field") == "automation_profile"


async def test_the_session_profile_applies_to_plans_its_turns_start(
    client: ACPClient, tmp_path: pathlib.Path
) -> None:
    folder = tmp_path / "proj"
    helpers.write_tree(folder)
    await helpers.add_project(client, folder)
    await helpers.add_action(client)
    await helpers.add_profile(client, "hands-off", auto_execute=True)
    session = await _session(client, project="proj")
    await client.call(
        "session.update",
        session_id=session.meta.id,
        session={"automation_profile": "hands-off"},
        update_mask="automationProfile",
    )
    told = await client.call(
        "session.tell", session_id=session.meta.id, content="/use act name=g title=T word=w"
    )
    assert isinstance(told, session_pb2.TellSessionResponse)
    plan_id = told.replies[0].plan_id
    assert plan_id, told.replies[0].content
    plan = await helpers.status(client, plan_id)
    assert plan.automation_profile == "hands-off"


async def test_older_clients_never_see_revisions(client: ACPClient) -> None:
    session = await _session(client)
    old = ACPClient(client.transport, acp_version="1.2")
    shown = await old.call("session.show", session_id=session.meta.id)
    assert isinstance(shown, session_pb2.GetSessionResponse)
    assert shown.session.revision == 0
    await client.call(
        "session.update", session_id=session.meta.id, session={"title": "z"}, update_mask="title"
    )
    with pytest.raises(ACPError) as unknown:
        await old.call(
            "session.update", session_id=session.meta.id, session={"title": "q"}, update_mask="title"
        )
    assert unknown.value.code in ("NOT_FOUND", "VERSION_MISMATCH", "INVALID_PARAMS")
    # A 1.2 subscriber gets no session.updated event: the tell's message comes first.
    await client.call("session.tell", session_id=session.meta.id, content="hi")
    seen: list[events_pb2.Event] = []
    async for event in old.subscribe(session_id=session.meta.id):
        seen.append(event)
        break
    assert [e.WhichOneof("payload") for e in seen] == ["session_message"]


async def test_same_revision_session_updates_one_wins(two: tuple[ACPClient, ACPClient]) -> None:
    first, second = two
    session = await _session(first)
    revision, wins, mismatches = session.revision, 0, 0
    for round_ in range(ROUNDS):
        outcomes = await _outcomes(
            first.call(
                "session.update",
                session_id=session.meta.id,
                session={"title": f"first {round_}"},
                update_mask="title",
                if_revision=revision,
            ),
            second.call(
                "session.update",
                session_id=session.meta.id,
                session={"title": f"second {round_}"},
                update_mask="title",
                if_revision=revision,
            ),
        )
        won = [o for o in outcomes if isinstance(o, session_pb2.UpdateSessionResponse)]
        lost = [o for o in outcomes if isinstance(o, ACPError)]
        assert (len(won), len(lost)) == (1, 1), outcomes
        assert lost[0].details["refinement"] == "REVISION_MISMATCH"
        mismatches += 1
        wins += 1
        revision += 1
        assert won[0].session.revision == revision
        shown = await _show(second, session.meta.id)
        assert (shown.revision, shown.title) == (revision, won[0].session.title)
    assert (wins, mismatches) == (ROUNDS, ROUNDS)


async def test_same_revision_plan_cancels_one_wins(
    two: tuple[ACPClient, ACPClient], tmp_path: pathlib.Path
) -> None:
    first, second = two
    folder = tmp_path / "proj"
    helpers.write_tree(folder)
    await helpers.add_project(first, folder)
    await helpers.add_action(first)
    for _ in range(ROUNDS):
        plan = await helpers.use(first)
        assert plan.revision == 1
        outcomes = await _outcomes(
            first.call("plan.cancel", plan_id=plan.meta.id, if_revision=plan.revision),
            second.call("plan.cancel", plan_id=plan.meta.id, if_revision=plan.revision),
        )
        won = [o for o in outcomes if isinstance(o, plan_pb2.CancelPlanResponse)]
        lost = [o for o in outcomes if isinstance(o, ACPError)]
        assert (len(won), len(lost)) == (1, 1), outcomes
        assert lost[0].code == "INVALID_STATE"
        assert won[0].plan.revision == 2
        assert (await helpers.status(second, plan.meta.id)).revision == 2


def _turns_stored(db_path: pathlib.Path, session_id: str) -> list[session_pb2.Turn]:
    """The session's turns as the store holds them (a refused tell's queued turn would not
    show in session.show, whose turns are those of the history's messages)."""
    store = SQLiteStore(db_path)
    try:
        return turns.of_session(store, session_id)
    finally:
        store.close()


async def test_a_stale_revision_admits_no_turn(client: ACPClient, db_path: pathlib.Path) -> None:
    session = await _session(client)
    await client.call(
        "session.update", session_id=session.meta.id, session={"title": "a"}, update_mask="title"
    )
    for background in (False, True):
        with pytest.raises(ACPError) as refused:
            await client.call(
                "session.tell",
                session_id=session.meta.id,
                content="late",
                background=background,
                if_revision=1,
            )
        assert (refused.value.code, refused.value.details["refinement"]) == (
            "INVALID_STATE",
            "REVISION_MISMATCH",
        )
        assert (refused.value.details["expected"], refused.value.details["actual"]) == (1, 2)
    shown = await client.call("session.show", session_id=session.meta.id)
    assert isinstance(shown, session_pb2.GetSessionResponse)
    assert (shown.session.revision, shown.session.message_count, list(shown.messages)) == (2, 0, [])
    assert _turns_stored(db_path, session.meta.id) == []
    # The revision read: admitted (moving it once), then the message and the replies.
    told = await client.call("session.tell", session_id=session.meta.id, content="hello", if_revision=2)
    assert isinstance(told, session_pb2.TellSessionResponse)
    assert told.turn.state == session_pb2.TURN_STATE_SUCCEEDED
    assert (await _show(client, session.meta.id)).revision == 5
    assert [t.id for t in _turns_stored(db_path, session.meta.id)] == [told.turn.id]
    # A turn cancel takes one too: a stale one is refused first; the right one reaches the
    # turn (already ended here) and, refused, leaves the revision where it was.
    with pytest.raises(ACPError) as stale_cancel:
        await client.call(
            "session.cancel_turn", session_id=session.meta.id, turn_id=told.turn.id, if_revision=2
        )
    assert stale_cancel.value.details["refinement"] == "REVISION_MISMATCH"
    with pytest.raises(ACPError) as ended:
        await client.call(
            "session.cancel_turn", session_id=session.meta.id, turn_id=told.turn.id, if_revision=5
        )
    assert ended.value.details["refinement"] == "TURN_FINISHED"
    assert (await _show(client, session.meta.id)).revision == 5


async def test_same_revision_tells_one_admitted(tmp_path: pathlib.Path) -> None:
    """Two facades on one SQLite file (two processes' worth of writers), each round two
    tells from the same read: one turn in, the other refused, nothing of it stored."""
    target = tmp_path / "acp.db"
    first = ACPClient(LocalTransport(open_facade(target), owns_facade=True))
    second = ACPClient(LocalTransport(open_facade(target), owns_facade=True))
    try:
        session = await _session(first)
        revision, admitted = session.revision, []
        for round_ in range(TELL_ROUNDS):
            outcomes = await _outcomes(
                first.call(
                    "session.tell",
                    session_id=session.meta.id,
                    content=f"first {round_}",
                    if_revision=revision,
                ),
                second.call(
                    "session.tell",
                    session_id=session.meta.id,
                    content=f"second {round_}",
                    if_revision=revision,
                ),
            )
            won = [o for o in outcomes if isinstance(o, session_pb2.TellSessionResponse)]
            lost = [o for o in outcomes if isinstance(o, ACPError)]
            assert (len(won), len(lost)) == (1, 1), outcomes
            assert (lost[0].details["refinement"], lost[0].details["expected"]) == (
                "REVISION_MISMATCH",
                revision,
            )
            admitted.append(won[0].turn.id)
            shown = await second.call("session.show", session_id=session.meta.id)
            assert isinstance(shown, session_pb2.GetSessionResponse)
            # Admission, the user's message, the replies: three moves per round.
            assert shown.session.revision == revision + 3
            revision = shown.session.revision
            users = [m.content for m in shown.messages if m.role == session_pb2.MESSAGE_ROLE_USER]
            assert len(users) == round_ + 1
            assert users[-1] == won[0].message.content
        assert [t.id for t in _turns_stored(target, session.meta.id)] == admitted
    finally:
        await first.close()
        await second.close()
