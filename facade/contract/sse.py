"""The Server-Sent Events form of an ACP server stream, written by the gateway and read
by the HTTP client transport.

A stream item whose message holds exactly one message field (``SubscribeEventsResponse``
holds ``event``) travels as that field, so ``data:`` is the event itself. Each frame has
``id:`` the item's ``sequence`` (what ``Last-Event-ID`` resumes from) and ``event:`` its
``type``. A stream that ends in an error sends one ``event: error`` frame whose data is
an error envelope; its details name ``last_sequence``, the last sequence delivered.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from google.protobuf import descriptor, message

from cleveragents.acp.facade.contract import codec
from cleveragents.acp.facade.contract.catalog import Operation

ERROR_EVENT = "error"
# The request field Last-Event-ID fills, when the stream's request has one.
RESUME_FIELD = "after_sequence"


def item_field(op: Operation) -> descriptor.FieldDescriptor | None:
    """The one message field a stream item is sent as, or None to send the whole item."""
    fields = op.response_type.DESCRIPTOR.fields
    if len(fields) == 1 and fields[0].message_type is not None and not fields[0].is_repeated:
        return cast(descriptor.FieldDescriptor, fields[0])
    return None


def _payload(op: Operation, item: message.Message) -> message.Message:
    inner = item_field(op)
    return getattr(item, inner.name) if inner is not None else item


def item_id(op: Operation, item: message.Message) -> int | None:
    payload = _payload(op, item)
    if "sequence" in payload.DESCRIPTOR.fields_by_name:
        return int(payload.sequence)  # type: ignore[attr-defined]
    return None


def frame(op: Operation, item: message.Message) -> bytes:
    payload = _payload(op, item)
    names = payload.DESCRIPTOR.fields_by_name
    lines = []
    sequence = item_id(op, item)
    if sequence is not None:
        lines.append(f"id: {sequence}")
    kind = payload.type if "type" in names else ""  # type: ignore[attr-defined]
    lines.append(f"event: {kind or op.name}")
    lines.append("data: " + orjson.dumps(codec.to_dict(payload)).decode())
    return ("\n".join(lines) + "\n\n").encode()


def error_frame(envelope: dict[str, Any]) -> bytes:
    return f"event: {ERROR_EVENT}\ndata: {orjson.dumps(envelope).decode()}\n\n".encode()


def comment(text: str) -> bytes:
    return f": {text}\n\n".encode()


def item_from_data(op: Operation, data: dict[str, Any]) -> message.Message:
    """Rebuild a stream item from a frame's JSON data."""
    inner = item_field(op)
    if inner is None:
        return codec.response_from_dict(data, op.response_type)
    item = op.response_type()
    getattr(item, inner.name).CopyFrom(codec.response_from_dict(data, _message_class(op, inner)))
    return item


def _message_class(op: Operation, inner: descriptor.FieldDescriptor) -> type[message.Message]:
    return type(getattr(op.response_type(), inner.name))


@dataclass
class Event:
    event: str = "message"
    data: str = ""
    id: str | None = None


@dataclass
class Parser:
    """Incremental SSE parser (the WHATWG rules, minus `retry`): feed lines, get events."""

    _data: list[str] = field(default_factory=list)
    _event: str = ""
    _id: str | None = None

    def feed(self, line: str) -> Iterator[Event]:
        if line == "":
            event = Event(self._event or "message", "\n".join(self._data), self._id)
            complete = bool(self._data)
            self._data, self._event, self._id = [], "", None
            if complete:
                yield event
            return
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
