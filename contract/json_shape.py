"""Why JSON params do not fit a request message, in ACP's words: the field path
(``spec.resources.0``) and what that field takes or, for an unknown key, the fields the
message has. Used only once a parse has failed, so the accepted path costs nothing."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from google.protobuf import descriptor

FD = descriptor.FieldDescriptor
_INTEGERS = frozenset(
    {FD.TYPE_INT32, FD.TYPE_INT64, FD.TYPE_UINT32, FD.TYPE_UINT64, FD.TYPE_SINT32, FD.TYPE_SINT64}
    | {FD.TYPE_FIXED32, FD.TYPE_FIXED64, FD.TYPE_SFIXED32, FD.TYPE_SFIXED64}
)
_FLOATS = frozenset({FD.TYPE_DOUBLE, FD.TYPE_FLOAT})
_STRING_MESSAGES = frozenset(
    {"google.protobuf.Timestamp", "google.protobuf.Duration", "google.protobuf.FieldMask"}
)
# Whatever JSON these take, json_format judges it; nothing below them is walked.
_OPAQUE = frozenset(
    {"google.protobuf.Value", "google.protobuf.Any"}
    | {f"google.protobuf.{kind}Value" for kind in ("String", "Bytes", "Bool", "Double", "Float")}
    | {f"google.protobuf.{kind}Value" for kind in ("Int32", "Int64", "UInt32", "UInt64")}
)
_MAX_LISTED = 30


@dataclass(frozen=True)
class Misfit:
    path: str
    reason: str
    allowed: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return "an object"


def _expected(field: descriptor.FieldDescriptor) -> str:
    """What one value of the field is, in words."""
    if field.message_type is not None:
        name = field.message_type.full_name
        if name in _STRING_MESSAGES:
            return {"google.protobuf.Timestamp": "an RFC 3339 time string"}.get(name, "a string")
        if name == "google.protobuf.Struct":
            return "an object"
        if name == "google.protobuf.ListValue":
            return "a list"
        return f"an object ({field.message_type.name})"
    if field.enum_type is not None:
        values = ", ".join(v.name for v in field.enum_type.values)
        return f"one of {values}"
    if field.type == FD.TYPE_BOOL:
        return "true or false"
    if field.type in _INTEGERS:
        return "an integer"
    if field.type in _FLOATS:
        return "a number"
    if field.type == FD.TYPE_BYTES:
        return "a base64 string"
    return "a string"


def _scalar_fits(field: descriptor.FieldDescriptor, value: Any) -> bool:
    if field.enum_type is not None:
        if isinstance(value, str):
            return value in field.enum_type.values_by_name
        return isinstance(value, int) and not isinstance(value, bool)
    if field.type == FD.TYPE_BOOL:
        return isinstance(value, bool)
    if field.type in _INTEGERS:
        if isinstance(value, bool):
            return False
        if isinstance(value, float):
            return value.is_integer()
        return isinstance(value, int) or (isinstance(value, str) and value.lstrip("-").isdigit())
    if field.type in _FLOATS:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)) or isinstance(value, str)
    return isinstance(value, str)


def explain(data: Any, message: descriptor.Descriptor, prefix: str = "") -> Misfit | None:
    """The first place ``data`` does not fit ``message``, or None when its shape fits
    (then the value itself is wrong, which the parser's own words describe)."""
    for misfit in _walk(data, message, prefix):
        return misfit
    return None


def _walk(data: Any, message: descriptor.Descriptor, path: str) -> Iterator[Misfit]:
    if not isinstance(data, dict):
        yield Misfit(path or "params", f"expected an object ({message.name}), got {_kind(data)}")
        return
    by_json = {f.json_name: f for f in message.fields}
    for key, value in data.items():
        field = message.fields_by_name.get(key) if isinstance(key, str) else None
        field = field or (by_json.get(key) if isinstance(key, str) else None)
        here = f"{path}.{key}" if path else str(key)
        if field is None:
            names = tuple(sorted(message.fields_by_name))
            shown = ", ".join(names[:_MAX_LISTED]) + (", ..." if len(names) > _MAX_LISTED else "")
            yield Misfit(here, f"{message.name} has no field {key!r} (its fields: {shown})", names)
            return
        if value is None:
            continue
        yield from _field(field, value, here)


def _field(field: descriptor.FieldDescriptor, value: Any, path: str) -> Iterator[Misfit]:
    entry = field.message_type
    if entry is not None and entry.GetOptions().map_entry:
        if not isinstance(value, dict):
            yield Misfit(path, f"expected an object of KEY: VALUE, got {_kind(value)}")
            return
        for key, item in value.items():
            yield from _one(entry.fields_by_name["value"], item, f"{path}.{key}")
        return
    if field.is_repeated:
        if not isinstance(value, list):
            yield Misfit(path, f"expected a list (each {_expected(field)}), got {_kind(value)}")
            return
        for index, item in enumerate(value):
            yield from _one(field, item, f"{path}.{index}")
        return
    yield from _one(field, value, path)


def _one(field: descriptor.FieldDescriptor, value: Any, path: str) -> Iterator[Misfit]:
    nested = field.message_type
    if nested is None:
        if not _scalar_fits(field, value):
            yield Misfit(path, f"expected {_expected(field)}, got {_kind(value)}")
        return
    name = nested.full_name
    if name in _OPAQUE:
        return
    if name in _STRING_MESSAGES:
        if not isinstance(value, str):
            yield Misfit(path, f"expected {_expected(field)}, got {_kind(value)}")
        return
    if name == "google.protobuf.Struct":
        if not isinstance(value, dict):
            yield Misfit(path, f"expected an object, got {_kind(value)}")
        return
    if name == "google.protobuf.ListValue":
        if not isinstance(value, list):
            yield Misfit(path, f"expected a list, got {_kind(value)}")
        return
    yield from _walk(value, nested, path)
