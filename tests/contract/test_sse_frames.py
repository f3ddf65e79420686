"""SSE frames: the wire form of a stream item, shared by equal items, bounded in memory."""

from __future__ import annotations

import orjson

from cleveragents.acp.contract import catalog, codec, sse
from cleveragents.acp.v1 import events_pb2, session_pb2

OP = catalog.OPERATIONS["events.subscribe"]


def _item(
    sequence: int, content: str = "hello", kind: str = "session.message"
) -> events_pb2.SubscribeEventsResponse:
    event = events_pb2.Event(
        sequence=sequence,
        type=kind,
        namespace="default",
        session_id="s1",
        session_message=events_pb2.SessionMessage(message=session_pb2.Message(id="m", content=content)),
    )
    return events_pb2.SubscribeEventsResponse(event=event)


def test_a_frame_is_id_event_and_the_event_as_data() -> None:
    item = _item(7, "a\nb")
    frame, sequence = sse.encode(OP, item)
    assert sequence == 7
    head, data = frame.split(b"\ndata: ")
    assert head == b"id: 7\nevent: session.message"
    assert data.endswith(b"\n\n")
    assert data.count(b"\n") == 2
    assert orjson.loads(data) == codec.to_dict(item.event)
    assert sse.frame(OP, item) == frame
    assert sse.item_id(OP, item) == 7
    parsed = list(_parse(frame))
    assert [(e.id, e.event) for e in parsed] == [("7", "session.message")]
    assert sse.item_from_data(OP, orjson.loads(parsed[0].data)) == item


def test_without_a_type_the_event_is_named_after_the_operation() -> None:
    frame, _ = sse.encode(OP, _item(0, kind=""))
    assert frame.startswith(b"id: 0\nevent: events.subscribe\n")


def test_an_item_is_encoded_once_and_other_items_have_frames_of_their_own() -> None:
    item = _item(1)
    first = sse.encode(OP, item)
    assert sse.encode(OP, item) is first
    assert sse.encode(OP, _item(1)) == first
    assert sse.encode(OP, _item(1, "other")) != first
    assert sse.encode(OP, _item(2))[1] == 2


def test_an_item_no_other_stream_sends_is_encoded_alone() -> None:
    item = _item(4)
    frame = sse.encode(OP, item, shared=False)
    assert frame == sse.encode(OP, _item(4))
    found = sse._shape(OP).frames.get(id(item))
    assert found is None or found[0] is not item
    unnamed = sse.encode(OP, _item(0, kind=""), shared=False)[0]
    assert unnamed.startswith(b"id: 0\nevent: events.subscribe\ndata: {")


def test_the_frame_cache_is_bounded() -> None:
    for sequence in range(3 * sse.FRAME_CACHE_SIZE):
        sse.encode(OP, _item(sequence))
    assert len(sse._shape(OP).frames) <= 2 * sse.FRAME_CACHE_SIZE


def _parse(frame: bytes) -> list[sse.Event]:
    parser = sse.Parser()
    return [event for line in frame.decode().split("\n") for event in parser.feed(line)]
