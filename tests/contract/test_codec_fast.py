"""The fast codec answers exactly as json_format does, over every message type of the contract.

Messages are generated field by field from their descriptors (every scalar type, enums with
unknown numbers, maps, repeated fields, oneofs, Struct, Value, Timestamp, FieldMask), then
printed both ways (same JSON text, key order included) and parsed back both ways (same
bytes). Arbitrary JSON objects, valid or not, must parse to the same message or fail with
the same error."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from google.protobuf import descriptor, json_format, message, struct_pb2, timestamp_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cleveragents.acp.contract import codec, codec_fast, json_depth
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import (
    common_pb2,
    context_pb2,
    envelope_pb2,
    errors_pb2,
    events_pb2,
    meta_pb2,
    plan_pb2,
    registry_pb2,
    session_pb2,
    specs_pb2,
)

FD = descriptor.FieldDescriptor
MODULES = [
    common_pb2,
    context_pb2,
    envelope_pb2,
    errors_pb2,
    events_pb2,
    meta_pb2,
    plan_pb2,
    registry_pb2,
    session_pb2,
    specs_pb2,
]


def _all_messages(desc: descriptor.Descriptor) -> list[descriptor.Descriptor]:
    found = [desc]
    for nested in desc.nested_types:
        if not nested.GetOptions().map_entry:
            found += _all_messages(nested)
    return found


DESCRIPTORS = sorted(
    {
        d.full_name: d
        for module in MODULES
        for top in module.DESCRIPTOR.message_types_by_name.values()
        for d in _all_messages(top)
    }.items()
)


def _class(desc: descriptor.Descriptor) -> type[message.Message]:
    from google.protobuf import message_factory

    return message_factory.GetMessageClass(desc)


INT_RANGES = {
    FD.TYPE_INT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FD.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FD.TYPE_UINT32: (0, 2**32 - 1),
    FD.TYPE_FIXED32: (0, 2**32 - 1),
    FD.TYPE_INT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FD.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FD.TYPE_UINT64: (0, 2**64 - 1),
    FD.TYPE_FIXED64: (0, 2**64 - 1),
}
JSON_SCALARS = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=8)
JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
FINITE_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


def _scalar(field: descriptor.FieldDescriptor) -> st.SearchStrategy[Any]:
    if field.type in INT_RANGES:
        low, high = INT_RANGES[field.type]
        return st.integers(low, high) | st.sampled_from([0, low, high])
    if field.type == FD.TYPE_BOOL:
        return st.booleans()
    if field.type == FD.TYPE_STRING:
        return st.text(max_size=12)
    if field.type == FD.TYPE_BYTES:
        return st.binary(max_size=12)
    if field.type == FD.TYPE_DOUBLE:
        return st.floats()
    if field.type == FD.TYPE_FLOAT:
        return st.floats(width=32)
    if field.type == FD.TYPE_ENUM:
        enum_type: Any = field.enum_type
        numbers = [v.number for v in enum_type.values]
        return st.sampled_from(numbers) | st.integers(-3, 40)
    raise AssertionError(f"unhandled type {field.type}")


@st.composite
def messages(draw: st.DrawFn, desc: descriptor.Descriptor, depth: int = 0) -> message.Message:
    msg = _class(desc)()
    name = desc.full_name
    if name == "google.protobuf.Timestamp":
        seconds = draw(st.integers(-62135596800, 253402300799))
        nanos = draw(st.sampled_from([0, 5_000_000, 123_000]) | st.integers(0, 999_999_999))
        return timestamp_pb2.Timestamp(seconds=seconds, nanos=nanos)
    if name == "google.protobuf.Struct":
        value = draw(st.dictionaries(st.text(max_size=6), FINITE_JSON, max_size=3))
        struct = struct_pb2.Struct()
        struct.update(value)
        return struct
    if name == "google.protobuf.Value":
        value_msg = struct_pb2.Value()
        json_value: Any = draw(FINITE_JSON)
        json_format.ParseDict(json_value, value_msg)
        return value_msg
    if name == "google.protobuf.FieldMask":
        msg.paths.extend(draw(st.lists(st.sampled_from(["spec", "labels", "spec.steps"]), max_size=3)))  # type: ignore[attr-defined]
        return msg
    for field in desc.fields:
        if not draw(st.booleans()):
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key_field = field.message_type.fields_by_name["key"]
            value_field = field.message_type.fields_by_name["value"]
            keys = draw(st.lists(_scalar(key_field), max_size=3, unique=True))
            target = getattr(msg, field.name)
            for key in keys:
                if value_field.message_type is not None:
                    if depth < 2:
                        target[key].CopyFrom(draw(messages(value_field.message_type, depth + 1)))
                else:
                    target[key] = draw(_scalar(value_field))
        elif field.message_type is not None:
            if depth >= 2:
                continue
            if field.is_repeated:
                items = draw(st.lists(messages(field.message_type, depth + 1), max_size=2))
                getattr(msg, field.name).extend(items)
            else:
                getattr(msg, field.name).CopyFrom(draw(messages(field.message_type, depth + 1)))
        elif field.is_repeated:
            getattr(msg, field.name).extend(draw(st.lists(_scalar(field), max_size=3)))
        else:
            setattr(msg, field.name, draw(_scalar(field)))
    return msg


def _reference_dict(msg: message.Message) -> Any:
    return json_format.MessageToDict(
        msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


def _outcome(call: Any) -> tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as exc:
        return "error", f"{type(exc).__name__}: {exc}"


def _text(value: Any) -> str:
    """Order-preserving JSON text; NaN stays comparable."""
    return json.dumps(value, allow_nan=True)


def _reference_parse(data: Any, cls: type[message.Message]) -> message.Message:
    """codec.from_dict as it was before the fast path: depth check, then json_format."""
    if not isinstance(data, dict):
        raise ACPError("INVALID_PARAMS", f"params must be a JSON object, not {type(data).__name__}")
    if json_depth.depth(data) > json_depth.MAX_DEPTH:
        raise ACPError("INVALID_PARAMS", f"params is nested deeper than {json_depth.MAX_DEPTH} levels")
    try:
        return json_format.ParseDict(data, cls(), ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise ACPError("INVALID_PARAMS", f"invalid params: {exc}") from None
    except (ValueError, TypeError, RecursionError) as exc:
        raise ACPError("INVALID_PARAMS", f"invalid params: {exc}") from None


def _bytes(msg: message.Message) -> bytes:
    return msg.SerializeToString(deterministic=True)


def _same_parse(data: Any, cls: type[message.Message]) -> None:
    ours = _outcome(lambda: _bytes(codec.from_dict(data, cls)))
    reference = _outcome(lambda: _bytes(_reference_parse(data, cls)))
    assert ours[0] == reference[0], (data, ours, reference)
    if ours[0] == "ok":
        assert ours[1] == reference[1], data
    else:
        # Both refuse; the words are ACP's own (tests/contract/test_json_shape.py).
        assert ours[1].split(":", 1)[0] == reference[1].split(":", 1)[0], (data, ours, reference)


FUZZ = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.mark.parametrize(("name", "desc"), DESCRIPTORS, ids=[name for name, _ in DESCRIPTORS])
@FUZZ
@given(data=st.data())
def test_print_and_parse_match_json_format(
    name: str, desc: descriptor.Descriptor, data: st.DataObject
) -> None:
    msg = data.draw(messages(desc))
    ours = _outcome(lambda: _text(codec.to_dict(msg)))
    reference = _outcome(lambda: _text(_reference_dict(msg)))
    assert ours == reference
    _same_as_the_walk(desc, msg)
    if reference[0] != "ok":
        return
    printed = _reference_dict(msg)
    _same_parse(printed, type(msg))
    parsed = _outcome(lambda: _bytes(codec.response_from_dict(printed, type(msg))))
    expected = _outcome(
        lambda: _bytes(json_format.ParseDict(printed, type(msg)(), ignore_unknown_fields=True))
    )
    assert parsed[0] == expected[0]
    if parsed[0] == "ok":
        assert parsed[1] == expected[1]


def _same_as_the_walk(desc: Any, msg: message.Message) -> None:
    """A type's generated printer answers as the table walk does, on its own (a generated
    printer that raised would otherwise hide behind json_format's answer)."""
    plan = codec_fast._out(desc)
    compiled = codec_fast._compile(desc, plan)
    if compiled is None:
        return
    walked = _outcome(lambda: _text(codec_fast._walk(plan, msg)))
    printed = _outcome(lambda: _text(compiled(msg)))
    assert printed[0] == walked[0], (printed, walked)
    if walked[0] == "ok":
        assert printed[1] == walked[1]


def test_plain_types_get_a_generated_printer() -> None:
    """The types streamed and listed most are printed by generated code; a float without
    presence (-0.0 is listed though it tests false) keeps the walk."""
    for cls in (events_pb2.Event, events_pb2.PlanStateChanged, session_pb2.Session, common_pb2.EntityMeta):
        assert codec_fast._compile(cls.DESCRIPTOR, codec_fast._out(cls.DESCRIPTOR)) is not None, cls
    desc = events_pb2.ToolCompleted.DESCRIPTOR
    assert codec_fast._compile(desc, codec_fast._out(desc)) is None
    negative_zero = events_pb2.ToolCompleted(duration_ms=-0.0)
    assert _text(codec.to_dict(negative_zero)) == _text(_reference_dict(negative_zero))


def _made_type(fields: list[tuple[str, int, int | None]], oneofs: int) -> type[message.Message]:
    """A proto3 message type of string fields (name, number, oneof index), in a pool of its own."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="made.proto", package="made", syntax="proto3")
    made = proto.message_type.add(name="Made")
    for index in range(oneofs):
        made.oneof_decl.add(name=f"choice{index}")
    for name, number, oneof in fields:
        field = made.field.add(name=name, number=number, type=FD.TYPE_STRING, label=FD.LABEL_OPTIONAL)
        if oneof is not None:
            field.oneof_index = oneof
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("made.Made"))


def test_generated_printers_keep_the_walks_order_and_names() -> None:
    # Declared out of number order, a keyword for a name, a oneof after the plain fields.
    cls = _made_type([("from", 3, None), ("a", 1, None), ("x", 7, 0), ("y", 5, 0)], 1)
    assert codec_fast._compile(cls.DESCRIPTOR, codec_fast._out(cls.DESCRIPTOR)) is not None
    for msg in (cls(), cls(a="1", **{"from": "f"}), cls(**{"from": "f"}, y="2"), cls(a="1", x="3")):
        assert _text(codec.to_dict(msg)) == _text(_reference_dict(msg))
        _same_as_the_walk(cls.DESCRIPTOR, msg)
    # A oneof whose numbers enclose another field's cannot be read at one place in order.
    enclosing = _made_type([("x", 1, 0), ("b", 2, None), ("z", 3, 0)], 1)
    assert codec_fast._compile(enclosing.DESCRIPTOR, codec_fast._out(enclosing.DESCRIPTOR)) is None
    msg = enclosing(b="2", z="3")
    assert _text(codec.to_dict(msg)) == _text(_reference_dict(msg))


def _keys(desc: Any) -> st.SearchStrategy[str]:
    names = [f.name for f in desc.fields] + [f.json_name for f in desc.fields]
    return st.sampled_from(names) | st.text(max_size=5) if names else st.text(max_size=5)


@pytest.mark.parametrize(
    "cls",
    [
        session_pb2.CreateSessionRequest,
        session_pb2.GetSessionRequest,
        plan_pb2.UsePlanRequest,
        registry_pb2.AddActionRequest,
        events_pb2.SubscribeEventsRequest,
        events_pb2.Event,
        common_pb2.EntityMeta,
    ],
)
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_arbitrary_json_parses_or_fails_as_json_format(
    cls: type[message.Message], data: st.DataObject
) -> None:
    desc = cls.DESCRIPTOR
    value: Any = data.draw(st.dictionaries(_keys(desc), JSON, max_size=4))
    _same_parse(value, cls)


@pytest.mark.parametrize(
    "value",
    [
        {"session_id": "a", "sessionId": "b"},
        {"session_id": None},
        {"session_id": 5},
        {"session_id": "\ud800"},
        {"title": "t", "labels": {"k": 1}},
        {"labels": {"k": "v"}, "title": None},
        {"after_sequence": "12"},
        {"after_sequence": "1 2"},
        {"after_sequence": 1.0},
        {"event_type": ["a", None]},
        {"inputs": {"a": [1, {"b": None}], "c": float("nan")}},
        {"inputs": {"deep": json.loads("[" * 70 + "]" * 70)}},
        {"inputs": {"deep": json.loads("[" * 30 + "]" * 30)}},
        [],
        "params",
    ],
)
@pytest.mark.parametrize(
    "cls", [session_pb2.GetSessionRequest, session_pb2.CreateSessionRequest, plan_pb2.UsePlanRequest]
)
def test_edge_inputs_fail_or_parse_as_before(value: Any, cls: type[message.Message]) -> None:
    _same_parse(value, cls)


def test_nan_and_infinity_print_as_json_format_does() -> None:
    for number in (math.inf, -math.inf, math.nan, 1.5):
        msg = events_pb2.ToolCompleted(duration_ms=number)
        assert _text(codec.to_dict(msg)) == _text(_reference_dict(msg))


def test_common_messages_take_the_fast_path() -> None:
    """Not every input falls back: the plain shapes are converted by codec_fast itself."""
    from cleveragents.acp.contract import codec_fast

    request = session_pb2.CreateSessionRequest()
    codec_fast.from_dict({"title": "t", "labels": {"a": "b"}, "namespace": "default"}, request)
    assert request.labels["a"] == "b"
    session = session_pb2.Session(title="t", state=session_pb2.SESSION_STATE_ACTIVE)
    session.meta.create_time.FromSeconds(1_700_000_000)
    assert codec_fast.to_dict(session) == _reference_dict(session)
    use = plan_pb2.UsePlanRequest()
    codec_fast.from_dict({"action": "a", "project": "p", "inputs": {"name": "x", "n": [1, 2]}}, use)
    assert use.inputs["n"] == [1, 2]


def test_timestamps_print_as_json_format_does_across_days_and_edges() -> None:
    seconds = [-62135596800, 253402300799, -1, 0, 59, 60, 3599, 3600, 86399, 86400, 951782400]
    seconds += [1_700_000_000 + 86400 * day + 3661 for day in range(0, 5 * codec_fast._DAYS_KEPT, 997)]
    for second in seconds:
        for nanos in (0, 1, 1000, 1_000_000, 999_999_999, 456_677_000):
            stamp = timestamp_pb2.Timestamp(seconds=second, nanos=nanos)
            assert codec_fast._timestamp(stamp) == stamp.ToJsonString(), (second, nanos)
    assert len(codec_fast._DAY_TEXT) <= codec_fast._DAYS_KEPT
