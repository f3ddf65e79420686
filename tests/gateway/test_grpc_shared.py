"""gRPC stream items: one serialization per item object while several streams share it."""

from __future__ import annotations

import pytest

from cleveragents.acp.gateway.grpc import shared
from cleveragents.acp.v1 import events_pb2

OP = "events.subscribe"


def _item(sequence: int) -> events_pb2.SubscribeEventsResponse:
    event = events_pb2.Event(sequence=sequence, type="session.message", session_id="s1")
    event.session_message.message.content = "shared"
    return events_pb2.SubscribeEventsResponse(event=event)


def test_the_same_item_is_serialized_once_for_every_open_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(shared.OPEN, OP, 3)
    serialize = shared.StreamSerializer(OP)
    item = _item(1)
    first = serialize(item)
    assert first == item.SerializeToString()
    # SerializeToString makes new bytes each call: the same object means it ran once.
    assert all(serialize(item) is first for _ in range(2))
    equal = _item(1)
    assert serialize(equal) == first
    assert serialize(equal) is not first


def test_with_one_stream_open_nothing_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(shared.OPEN, OP, 1)
    serialize = shared.StreamSerializer(OP)
    item = _item(2)
    first = serialize(item)
    assert serialize(item) == first
    assert serialize(item) is not first
    assert len(serialize.kept) == 0
