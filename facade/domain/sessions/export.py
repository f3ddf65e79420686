"""The session export document (format ``cleveragents.acp.session``, version 2;
version 1, from before turns, still imports).

``build`` writes it; ``parse`` reads it back (from the request's Struct), refusing anything
malformed with INVALID_PARAMS naming the JSON path of what is wrong (``$.messages[2].role``). The
format is specified in docs/session-export.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, message, struct_pb2, timestamp_pb2
from ulid import ULID

from cleveragents.acp.contract import codec
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.bounded import slices
from cleveragents.acp.facade.domain.sessions.records import STATE_NAMES
from cleveragents.acp.v1 import context_pb2, session_pb2

FORMAT = "cleveragents.acp.session"
VERSION = 2
SUPPORTED_VERSIONS = (1, VERSION)
_FIELDS = ("format", "version", "exported_at", "session", "messages", "context", "turns")
_TURN_STATES = {
    session_pb2.TURN_STATE_SUCCEEDED,
    session_pb2.TURN_STATE_FAILED,
    session_pb2.TURN_STATE_CANCELLED,
    session_pb2.TURN_STATE_INTERRUPTED,
}
_ROLES = {
    value: session_pb2.MessageRole.Name(value)
    for value in session_pb2.MessageRole.values()
    if value != session_pb2.MESSAGE_ROLE_UNSPECIFIED
}
_REQUIRED = ("format", "version", "exported_at", "session", "messages")


@dataclass(frozen=True)
class Imported:
    """A checked document: its messages already in their stored form, in order."""

    session: session_pb2.Session
    rows: list[bytes]
    context: context_pb2.ContextConfig | None
    turns: list[session_pb2.Turn]


def build(
    given: session_pb2.Session,
    messages: list[session_pb2.Message],
    context: context_pb2.ContextConfig | None,
    exported_at: timestamp_pb2.Timestamp,
    turns: list[session_pb2.Turn],
) -> dict[str, Any]:
    # A revision orders one store's changes to one record, not content: an imported copy is
    # a new record that starts at its own first revision, so the document carries none (not
    # even the 0 proto3 JSON prints for a cleared field).
    session = codec.to_dict(given)
    session.pop("revision", None)
    return {
        "format": FORMAT,
        "version": VERSION,
        "exported_at": exported_at.ToJsonString(),
        "session": session,
        "messages": [codec.to_dict(m) for m in messages],
        "context": codec.to_dict(context) if context is not None else None,
        "turns": [codec.to_dict(t) for t in turns],
    }


def invalid(path: str, problem: str, **details: Any) -> ACPError:
    """INVALID_PARAMS about the document, naming the JSON path of what is wrong."""
    return ACPError(
        ErrorCode.INVALID_PARAMS,
        f"invalid session export document at {path}: {problem}",
        {"field": "document", "path": path, **details},
    )


def _parse_message(value: Any, cls: type[codec.M], path: str) -> codec.M:
    if not isinstance(value, dict):
        raise invalid(path, f"expected an object, got {_json_type(value)}")
    try:
        return json_format.ParseDict(value, cls(), ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError, TypeError) as exc:
        raise invalid(path, str(exc)) from None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _require_time(msg: message.Message, field_name: str, path: str) -> None:
    if not msg.HasField(field_name):
        raise invalid(f"{path}.{field_name}", "missing")


def parse(document: struct_pb2.Struct) -> Imported:
    """The session, messages (stored form) and context configuration a document holds, all checked."""
    return slices.run(parsing(document))


def _plain(value: struct_pb2.Value) -> Any:
    return json_format.MessageToDict(value)


def parsing(document: struct_pb2.Struct) -> slices.Sliced[Imported]:
    """``parse``, yielding between slices of messages. Each message goes from the Struct to
    its stored row on its own, checked on the way, and only the row is kept: a 28 MiB
    document held a whole dict copy, a message list and the rows at once (~400 MiB, 14x
    the document), now the rows (about the document's size) and the ids."""
    fields = document.fields
    unknown = sorted(set(fields) - set(_FIELDS))
    if unknown:
        raise invalid(
            f"$.{unknown[0]}", f"unknown field (a version {VERSION} document has {', '.join(_FIELDS)})"
        )
    for key in _REQUIRED:
        if key not in fields:
            raise invalid(f"$.{key}", "missing")
    format_ = _plain(fields["format"])
    if format_ != FORMAT:
        raise invalid("$.format", f"expected {FORMAT!r}, got {format_!r}")
    version = _plain(fields["version"])
    if isinstance(version, bool) or not isinstance(version, int | float) or version not in SUPPORTED_VERSIONS:
        raise invalid(
            "$.version",
            f"unsupported version {version!r}; this server reads version {VERSION}",
            supported_versions=list(SUPPORTED_VERSIONS),
        )
    exported_at = _plain(fields["exported_at"])
    if not isinstance(exported_at, str):
        raise invalid("$.exported_at", f"expected an RFC 3339 string, got {_json_type(exported_at)}")
    try:
        timestamp_pb2.Timestamp().FromJsonString(exported_at)
    except ValueError as exc:
        raise invalid("$.exported_at", f"not an RFC 3339 time: {exc}") from None

    session = _parse_message(_plain(fields["session"]), session_pb2.Session, "$.session")
    _check_session(session)
    raw_messages = fields["messages"]
    if raw_messages.WhichOneof("kind") != "list_value":
        raise invalid("$.messages", f"expected an array, got {_json_type(_plain(raw_messages))}")
    rows: list[bytes] = []
    ids: set[str] = set()
    for i, item in enumerate(raw_messages.list_value.values):
        path = f"$.messages[{i}]"
        msg = _parse_message(_plain(item), session_pb2.Message, path)
        _check_message(msg, i, path, ids)
        rows.append(msg.SerializeToString(deterministic=True))
        if i % slices.SLICE == slices.SLICE - 1:
            yield
    if session.message_count != len(rows):
        raise invalid(
            "$.session.message_count",
            f"says {session.message_count} but the document holds {len(rows)} messages",
        )
    raw_context = _plain(fields["context"]) if "context" in fields else None
    context = (
        None if raw_context is None else _parse_message(raw_context, context_pb2.ContextConfig, "$.context")
    )
    raw_turns = _plain(fields["turns"]) if "turns" in fields else []
    if not isinstance(raw_turns, list):
        raise invalid("$.turns", f"expected an array, got {_json_type(raw_turns)}")
    turns = [_parse_message(t, session_pb2.Turn, f"$.turns[{i}]") for i, t in enumerate(raw_turns)]
    _check_turns(turns, ids)
    return Imported(session, rows, context, turns)


def _check_turns(turns: list[session_pb2.Turn], message_ids: set[str]) -> None:
    """Each turn once, ended (a turn queued or running when exported ran nowhere since),
    its messages in the document."""
    ids: set[str] = set()
    for i, turn in enumerate(turns):
        path = f"$.turns[{i}]"
        try:
            ULID.from_str(turn.id)
        except ValueError as exc:
            raise invalid(f"{path}.id", f"not a ULID: {exc}") from None
        if turn.id in ids:
            raise invalid(f"{path}.id", f"{turn.id!r} is used by an earlier turn")
        ids.add(turn.id)
        if turn.state not in _TURN_STATES:
            raise invalid(
                f"{path}.state", "must be an ended state: succeeded, failed, cancelled, interrupted"
            )
        for j, reply in enumerate(turn.reply_ids):
            if reply not in message_ids:
                raise invalid(f"{path}.reply_ids[{j}]", f"no message {reply!r} in the document")


def _check_session(session: session_pb2.Session) -> None:
    if not session.HasField("meta"):
        raise invalid("$.session.meta", "missing")
    try:
        ULID.from_str(session.meta.id)
    except ValueError as exc:
        raise invalid("$.session.meta.id", f"not a ULID: {exc}") from None
    if not session.meta.namespace:
        raise invalid("$.session.meta.namespace", "missing")
    _require_time(session.meta, "create_time", "$.session.meta")
    _require_time(session.meta, "update_time", "$.session.meta")
    if not session.orchestrator:
        raise invalid("$.session.orchestrator", "missing")
    if session.state not in STATE_NAMES:
        raise invalid("$.session.state", "must be SESSION_STATE_ACTIVE or SESSION_STATE_CLOSED")


def _check_message(msg: session_pb2.Message, i: int, path: str, ids: set[str]) -> None:
    """The message at position ``i``; ``ids``: those of the messages before it (added to)."""
    if not msg.id:
        raise invalid(f"{path}.id", "missing")
    if msg.id in ids:
        raise invalid(f"{path}.id", f"{msg.id!r} is used by an earlier message")
    ids.add(msg.id)
    if msg.index != i:
        raise invalid(f"{path}.index", f"is {msg.index}, but the message is at position {i}")
    if msg.role not in _ROLES:
        raise invalid(f"{path}.role", f"must be one of {', '.join(sorted(_ROLES.values()))}")
    _require_time(msg, "create_time", path)
