"""session.export / session.import: the versioned document, identity, clashes, bad documents."""

from __future__ import annotations

import asyncio
import copy
import pathlib
from typing import Any

import pytest
from google.protobuf import json_format

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.v1 import context_pb2, session_pb2
from tests.facade.domain.session_helpers import add_project, create, error_of, tell


async def export(client: ACPClient, session_id: str) -> dict[str, Any]:
    response = await client.call("session.export", session_id=session_id)
    assert isinstance(response, session_pb2.ExportSessionResponse)
    return json_format.MessageToDict(response.document)


async def import_(client: ACPClient, document: dict[str, Any], **fields: Any) -> session_pb2.Session:
    response = await client.call("session.import", document=document, **fields)
    assert isinstance(response, session_pb2.ImportSessionResponse)
    return response.session


def without(document: dict[str, Any], *paths: tuple[str, ...]) -> dict[str, Any]:
    """A deep copy with the given (nested) keys removed."""
    copied = copy.deepcopy(document)
    for path in paths:
        target = copied
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return copied


def unturned(document: dict[str, Any]) -> dict[str, Any]:
    """The document with its turn ids (and the turns' session ids) left out: an import with
    ``new_id`` gives the turns fresh ids, as it does the session."""
    copied = copy.deepcopy(document)
    for message in copied["messages"]:
        message.pop("turn_id", None)
    for turn in copied.get("turns", []):
        turn.pop("id", None)
        turn.pop("session_id", None)
    return copied


@pytest.fixture
async def conversation(client: ACPClient, tmp_path: pathlib.Path) -> session_pb2.Session:
    await add_project(client, "web", tmp_path / "web")
    await client.call("skill.add", name="tone", spec={"instructions": "Be brief."})
    session = await create(client, title="talk", project="web", labels={"k": "v"})
    await tell(client, session.meta.id, "/help")
    await tell(client, session.meta.id, "hello there")
    await client.call(
        "context.set",
        session_id=session.meta.id,
        config={
            "sources": [{"resource": "web-src", "globs": ["**/*.md"]}],
            "skills": ["tone"],
            "token_budget": 99,
        },
    )
    return session


async def test_document_shape(client: ACPClient, conversation: session_pb2.Session) -> None:
    document = await export(client, conversation.meta.id)
    assert set(document) == {"format", "version", "exported_at", "session", "messages", "context", "turns"}
    assert document["format"] == "cleveragents.acp.session"
    assert document["version"] == 2
    # One turn per tell: the user's message, its reply, its state.
    turns = document["turns"]
    assert [t["state"] for t in turns] == ["TURN_STATE_SUCCEEDED"] * 2
    assert [t["message_id"] for t in turns] == [document["messages"][i]["id"] for i in (0, 2)]
    assert [t["reply_ids"] for t in turns] == [[document["messages"][i]["id"]] for i in (1, 3)]
    assert [m["in_reply_to"] for m in document["messages"]] == [
        "",
        document["messages"][0]["id"],
        "",
        document["messages"][2]["id"],
    ]
    assert document["session"]["meta"]["id"] == conversation.meta.id
    assert document["session"]["state"] == "SESSION_STATE_ACTIVE"
    assert document["session"]["message_count"] == 4
    # No revision: an imported copy is a new record, at its own revision 1.
    assert "revision" not in document["session"]
    assert [m["index"] for m in document["messages"]] == [0, 1, 2, 3]
    assert [m["role"] for m in document["messages"]] == ["MESSAGE_ROLE_USER", "MESSAGE_ROLE_ORCHESTRATOR"] * 2
    assert document["context"] == {
        "sources": [{"resource": "web-src", "globs": ["**/*.md"]}],
        "skills": ["tone"],
        "token_budget": 99,
    }
    bare = await create(client)
    assert (await export(client, bare.meta.id))["context"] is None


async def test_export_import_export_is_identical(
    client: ACPClient, conversation: session_pb2.Session
) -> None:
    sid = conversation.meta.id
    first = await export(client, sid)
    await client.call("session.delete", session_id=sid)
    imported = await import_(client, first)
    assert imported.meta.id == sid
    second = await export(client, sid)
    assert without(second, ("exported_at",)) == without(first, ("exported_at",))
    shown = await client.call("session.show", session_id=sid)
    assert isinstance(shown, session_pb2.GetSessionResponse)
    assert shown.session == imported
    context = await client.call("context.show", session_id=sid)
    assert isinstance(context, context_pb2.GetContextResponse)
    assert context.origin == "session"
    # The imported session goes on where it left off.
    told = await tell(client, sid, "/help")
    assert told.message.index == 4


async def test_id_clash_and_new_id(client: ACPClient, conversation: session_pb2.Session) -> None:
    sid = conversation.meta.id
    document = await export(client, sid)
    err = await error_of(client, "session.import", document=document)
    assert err.code == "ALREADY_EXISTS"
    assert err.details == {"session_id": sid, "refinement": "SESSION_ALREADY_EXISTS"}
    assert "new_id" in err.message

    copy_ = await import_(client, document, new_id=True)
    assert copy_.meta.id != sid
    # Same creation instant: the copy lists where the original does.
    assert copy_.meta.id[:10] == sid[:10]
    again = await export(client, copy_.meta.id)
    assert unturned(without(again, ("exported_at",), ("session", "meta", "id"))) == unturned(
        without(document, ("exported_at",), ("session", "meta", "id"))
    )
    # Both sessions hold their own history and context.
    await client.call("session.delete", session_id=sid)
    shown = await client.call("session.show", session_id=copy_.meta.id)
    assert isinstance(shown, session_pb2.GetSessionResponse)
    assert len(shown.messages) == 4
    context = await client.call("context.show", session_id=copy_.meta.id)
    assert isinstance(context, context_pb2.GetContextResponse)
    assert list(context.config.skills) == ["tone"]


async def test_import_into_another_namespace(
    client: ACPClient, conversation: session_pb2.Session, tmp_path: pathlib.Path
) -> None:
    document = await export(client, conversation.meta.id)
    err = await error_of(client, "session.import", document=document, new_id=True, namespace="other")
    assert (err.code, err.details["path"]) == ("INVALID_PARAMS", "$.session.project")
    await add_project(client, "web", tmp_path / "other", namespace="other")
    err = await error_of(client, "session.import", document=document, new_id=True, namespace="other")
    assert (err.code, err.details["path"]) == ("INVALID_PARAMS", "$.context.skills[0]")
    await client.call("skill.add", namespace="other", name="tone", spec={"instructions": "Be brief."})
    moved = await import_(client, document, new_id=True, namespace="other")
    assert moved.meta.namespace == "other"
    again = await export(client, moved.meta.id)
    assert again["session"]["meta"]["namespace"] == "other"
    assert unturned(again)["messages"] == unturned(document)["messages"]
    assert unturned(again)["turns"] == unturned(document)["turns"]


async def test_a_version_1_document_still_imports(
    client: ACPClient, conversation: session_pb2.Session
) -> None:
    """Exports from before turns (version 1: no ``turns``, no turn fields) import as they were."""
    document = unturned(await export(client, conversation.meta.id))
    del document["turns"]
    for message in document["messages"]:
        message.pop("in_reply_to", None)
        message.pop("partial", None)
    document["version"] = 1
    imported = await import_(client, document, new_id=True)
    shown = await client.call("session.show", session_id=imported.meta.id)
    assert isinstance(shown, session_pb2.GetSessionResponse)
    assert shown.messages[0].content == "/help"
    assert list(shown.turns) == []
    # The imported session takes new tells as turns.
    told = await tell(client, imported.meta.id, "/help")
    assert told.turn.state == session_pb2.TURN_STATE_SUCCEEDED
    assert told.message.index == 4


async def test_closed_session_round_trips_closed(client: ACPClient) -> None:
    session = await create(client)
    await tell(client, session.meta.id, "/close")
    document = await export(client, session.meta.id)
    assert document["session"]["state"] == "SESSION_STATE_CLOSED"
    imported = await import_(client, document, new_id=True)
    assert imported.state == session_pb2.SESSION_STATE_CLOSED
    err = await error_of(client, "session.tell", session_id=imported.meta.id, content="/help")
    assert err.code == "INVALID_STATE"


def _bad_documents(good: dict[str, Any]) -> list[tuple[str, dict[str, Any], str]]:
    """(what, document, the JSON path the error must name)."""

    def edit(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
        copied = copy.deepcopy(good)
        target = copied
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        return copied

    return [
        ("empty", {}, "$.format"),
        ("unknown top-level field", {**good, "extra": 1}, "$.extra"),
        ("wrong format", edit(("format",), "something.else"), "$.format"),
        ("future version", edit(("version",), 3), "$.version"),
        ("version as text", edit(("version",), "1"), "$.version"),
        ("version as boolean", edit(("version",), True), "$.version"),
        ("no session", without(good, ("session",)), "$.session"),
        ("no messages", without(good, ("messages",)), "$.messages"),
        ("bad export time", edit(("exported_at",), "yesterday"), "$.exported_at"),
        ("session not an object", edit(("session",), [1]), "$.session"),
        ("unknown session field", edit(("session", "colour"), "red"), "$.session"),
        ("id not a ULID", edit(("session", "meta", "id"), "abc"), "$.session.meta.id"),
        ("no namespace", edit(("session", "meta", "namespace"), ""), "$.session.meta.namespace"),
        ("no create time", without(good, ("session", "meta", "create_time")), "$.session.meta.create_time"),
        ("bad state", edit(("session", "state"), "SESSION_STATE_UNSPECIFIED"), "$.session.state"),
        ("no orchestrator", edit(("session", "orchestrator"), ""), "$.session.orchestrator"),
        ("missing orchestrator", edit(("session", "orchestrator"), "ghost"), "$.session.orchestrator"),
        ("bad label key", edit(("session", "labels"), {"": "x"}), "$.session.labels."),
        ("count disagrees", edit(("session", "message_count"), 3), "$.session.message_count"),
        ("messages not an array", edit(("messages",), {}), "$.messages"),
        ("message not an object", edit(("messages", 1), "hi"), "$.messages[1]"),
        ("message index out of order", edit(("messages", 1, "index"), 5), "$.messages[1].index"),
        ("fractional index", edit(("messages", 1, "index"), 0.5), "$.messages[1]"),
        ("message without id", edit(("messages", 0, "id"), ""), "$.messages[0].id"),
        ("duplicate message id", edit(("messages", 1, "id"), good["messages"][0]["id"]), "$.messages[1].id"),
        ("unspecified role", edit(("messages", 0, "role"), "MESSAGE_ROLE_UNSPECIFIED"), "$.messages[0].role"),
        ("unknown role number", edit(("messages", 0, "role"), 9), "$.messages[0].role"),
        ("bad message time", edit(("messages", 0, "create_time"), "noon"), "$.messages[0]"),
        ("context not an object", edit(("context",), "all"), "$.context"),
        ("turns not an array", edit(("turns",), {}), "$.turns"),
        ("turn still running", edit(("turns", 0, "state"), "TURN_STATE_RUNNING"), "$.turns[0].state"),
        ("turn id not a ULID", edit(("turns", 1, "id"), "t1"), "$.turns[1].id"),
        ("reply not in the document", edit(("turns", 0, "reply_ids"), ["m9"]), "$.turns[0].reply_ids[0]"),
        ("negative budget", edit(("context", "token_budget"), -1), "$.context.token_budget"),
        (
            "missing resource",
            edit(("context", "sources", 0, "resource"), "gone"),
            "$.context.sources[0].resource",
        ),
    ]


async def test_malformed_documents_name_what_is_wrong(
    client: ACPClient, conversation: session_pb2.Session
) -> None:
    good = await export(client, conversation.meta.id)
    for what, document, path in _bad_documents(good):
        err = await error_of(client, "session.import", document=document, new_id=True)
        assert err.code == "INVALID_PARAMS", what
        assert err.details["path"] == path, (what, err.message)
        assert path in err.message, what
    err = await error_of(client, "session.import", document={**good, "version": 3}, new_id=True)
    assert err.details["supported_versions"] == [1, 2]
    listed = await client.call("session.list")
    assert isinstance(listed, session_pb2.ListSessionsResponse)
    assert len(listed.sessions) == 1


async def test_import_needs_a_document(client: ACPClient) -> None:
    err = await error_of(client, "session.import")
    assert (err.code, err.details["missing_fields"]) == ("INVALID_PARAMS", ["document"])


MESSAGES = 5_000


async def test_a_big_import_lets_other_calls_through(
    client: ACPClient, conversation: session_pb2.Session
) -> None:
    """The document is read in slices: calls made meanwhile are answered before it ends
    (it used to hold the loop to the end: 2.2 s for 30,000 messages)."""
    document = await export(client, conversation.meta.id)
    first = document["messages"][0]
    document["messages"] = [
        {**first, "id": f"m{i}", "index": i, "content": f"message {i}"} for i in range(MESSAGES)
    ]
    document["session"]["message_count"] = MESSAGES
    document["turns"] = []
    importing = asyncio.create_task(import_(client, document, new_id=True))
    answered_meanwhile = 0
    while not importing.done():
        await client.call("session.show", session_id=conversation.meta.id)
        answered_meanwhile += 0 if importing.done() else 1
        await asyncio.sleep(0)
    imported = await importing
    assert imported.message_count == MESSAGES
    assert answered_meanwhile >= 5
