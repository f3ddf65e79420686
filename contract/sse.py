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

from cleveragents.acp.contract import codec
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.recent import Recent

ERROR_EVENT = "error"
# The request field Last-Event-ID fills, when the stream's request has one.
RESUME_FIELD = "after_sequence"


def item_field(op: Operation) -> descriptor.FieldDescriptor | None:
    """The one message field a stream item is sent as, or None to send the whole item."""
    fields = op.response_type.DESCRIPTOR.fields
    if len(fields) == 1 and fields[0].message_type is not None and not fields[0].is_repeated:
        return cast(descriptor.FieldDescriptor, fields[0])
    return None


# Frames kept per operation (per generation of the cache); an event's subscribers ask for
# its frame within moments of each other.
FRAME_CACHE_SIZE = 2048


class _Shape:
    """What framing needs to know of an operation's items, read from descriptors once."""

    __slots__ = ("frames", "inner", "sequence", "type")

    def __init__(self, op: Operation) -> None:
        inner = item_field(op)
        self.inner = inner.name if inner is not None else None
        payload: Any = inner.message_type if inner is not None else op.response_type.DESCRIPTOR
        self.sequence = "sequence" in payload.fields_by_name
        self.type = "type" in payload.fields_by_name
        # By the item itself (by identity, the entry holding it so its id names nothing
        # else): the subscribers of one event share its response object, never changed
        # once handed out, so they share its encoding, at the cost of a dict probe.
        self.frames: Recent[int, tuple[message.Message, tuple[bytes, int | None]]] = Recent(FRAME_CACHE_SIZE)


_SHAPES: dict[str, _Shape] = {}


def _shape(op: Operation) -> _Shape:
    shape = _SHAPES.get(op.name)
    if shape is None:
        shape = _SHAPES[op.name] = _Shape(op)
    return shape


def _payload(op: Operation, item: message.Message) -> message.Message:
    inner = _shape(op).inner
    return getattr(item, inner) if inner is not None else item


def item_id(op: Operation, item: message.Message) -> int | None:
    if _shape(op).sequence:
        return int(_payload(op, item).sequence)  # type: ignore[attr-defined]
    return None


def encode(op: Operation, item: message.Message, shared: bool = True) -> tuple[bytes, int | None]:
    """The frame of a stream item, and its ``id`` (the sequence, when items have one); made
    once per item object, however many streams send it. ``shared=False``: no other stream
    can be sending this item (only one is open), so it is neither looked up nor kept."""
    shape = _SHAPES.get(op.name) or _shape(op)
    if shared:
        found = shape.frames.get(id(item))
        if found is not None and found[0] is item:
            return found[1]
    payload: Any = getattr(item, shape.inner) if shape.inner is not None else item
    kind = (payload.type if shape.type else "") or op.name
    data = orjson.dumps(codec.to_dict(payload))
    encoded: tuple[bytes, int | None]
    if shape.sequence:
        sequence = int(payload.sequence)
        encoded = (b"id: %d\nevent: %b\ndata: %b\n\n" % (sequence, kind.encode(), data), sequence)
    else:
        encoded = (b"event: %b\ndata: %b\n\n" % (kind.encode(), data), None)
    if shared:
        shape.frames.put(id(item), (item, encoded))
    return encoded


def frame(op: Operation, item: message.Message) -> bytes:
    return encode(op, item)[0]


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
