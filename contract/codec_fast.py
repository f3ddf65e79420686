"""Compiled proto <-> JSON converters behind ``codec``: the same output as json_format, faster.

json_format walks descriptors and dispatches on field types for every value of every call
(about 20 µs for a small message). Here that walk is done once per message type, into a
table of per-field converters, and the call only runs the table.

Exactness is by construction rather than by re-implementation: whatever this module does
not handle in the plainest way (well-known types, floats, bytes, unknown enum numbers,
extensions, strings with surrogates, null, duplicate or oneof-conflicting keys, deep
values) makes it give up with ``UnsupportedError``, and ``codec`` then calls json_format
itself, so every error (and every odd input) gets json_format's own answer. Well-known
types are delegated to json_format's printer per field. Tests compare both paths over
every message type of the contract.

That delegation uses json_format's private API (``_Printer``, ``_FieldToJsonObject``,
``_UNPAIRED_SURROGATE_PATTERN``): kept because it pays (to_dict about 3.5 times, from_dict
about 2 times faster than json_format on session responses; issue 16's note has the
figures), and guarded by pinning protobuf to one major in pyproject.toml and by
tests/contract/test_codec_fast_newest_protobuf.py, which runs these tests against the newest
release of that major.
"""

from __future__ import annotations

import datetime
import keyword
from collections.abc import Callable
from typing import Any

from google.protobuf import descriptor, json_format, message

from cleveragents.acp.contract.json_depth import depth

__all__ = ["UnsupportedError", "from_dict", "to_dict"]

FD = descriptor.FieldDescriptor
# Descriptors are read dynamically (upb's and the pure-Python ones differ in their stubs).
Desc = Any
Field = Any

# json_format's printer with codec's options: the reference for delegated values.
# protobuf's private API, on purpose (the module docstring says why and what guards it).
_PRINTER: Any = json_format._Printer(  # type: ignore[attr-defined]  # noqa: SLF001  # the reference itself
    preserving_proto_field_name=True,
    always_print_fields_with_no_presence=True,
)
_SURROGATE: Any = json_format._UNPAIRED_SURROGATE_PATTERN  # type: ignore[attr-defined]  # noqa: SLF001

# Messages json_format prints or parses by a method of their own.
_SPECIAL = frozenset(
    {
        "google.protobuf.Any",
        "google.protobuf.Duration",
        "google.protobuf.FieldMask",
        "google.protobuf.ListValue",
        "google.protobuf.Struct",
        "google.protobuf.Timestamp",
        "google.protobuf.Value",
        "google.protobuf.BoolValue",
        "google.protobuf.BytesValue",
        "google.protobuf.DoubleValue",
        "google.protobuf.FloatValue",
        "google.protobuf.Int32Value",
        "google.protobuf.Int64Value",
        "google.protobuf.StringValue",
        "google.protobuf.UInt32Value",
        "google.protobuf.UInt64Value",
    }
)
_JSON_STRING_TYPES = frozenset({"google.protobuf.Duration"})
_INT64 = frozenset({FD.CPPTYPE_INT64, FD.CPPTYPE_UINT64})
_INT32 = frozenset({FD.CPPTYPE_INT32, FD.CPPTYPE_UINT32})
_FLOATS = frozenset({FD.CPPTYPE_FLOAT, FD.CPPTYPE_DOUBLE})
# Deeper JSON under a delegated well-known value goes the reference way, whose recursion
# limit counts message levels (two per JSON level in a Struct).
_DELEGATE_DEPTH = 24


class UnsupportedError(Exception):
    """This input is left to json_format."""


def _is_map(field: Field) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


# to_dict --------------------------------------------------------------------------------

Printer = Callable[[Any], Any]


class _Out:
    """How one message type prints: per set field a name and converter (None: the value
    as it is), then the defaults of fields without presence, in descriptor order (a
    constant, or a factory of a fresh empty list or dict)."""

    __slots__ = ("defaults", "fields", "special")

    def __init__(self) -> None:
        self.fields: dict[Field, tuple[str, Printer | None]] = {}
        self.defaults: list[tuple[str, Any, Callable[[], Any] | None]] = []
        self.special: Printer | None = None


_OUT: dict[Desc, _Out] = {}


def _identity(value: Any) -> Any:
    return value


def _enum_names(field: Field) -> dict[int, Any]:
    """json_format's own answer for each known number (custom JSON names included)."""
    to_json = _PRINTER._FieldToJsonObject  # noqa: SLF001  # json_format's own, on purpose (module docstring)
    return {number: to_json(field, number) for number in field.enum_type.values_by_number}


def _enum_printer(field: Field) -> Printer:
    names = _enum_names(field)
    if field.enum_type.full_name == "google.protobuf.NullValue":
        return lambda value: None

    def enum(value: int) -> Any:
        try:
            return names[value]
        except KeyError:
            raise UnsupportedError from None

    return enum


def _scalar_printer(field: Field) -> Printer:
    cpp = field.cpp_type
    if cpp == FD.CPPTYPE_MESSAGE:
        return _message_printer(field.message_type)
    if cpp == FD.CPPTYPE_ENUM:
        return _enum_printer(field)
    if cpp == FD.CPPTYPE_STRING and field.type != FD.TYPE_BYTES:
        return _identity
    if cpp in _INT64:
        return str
    if cpp in _INT32 or cpp == FD.CPPTYPE_BOOL:
        return _identity
    # bytes, float, double: json_format's own conversion (its private printer, on purpose).
    return lambda value: _PRINTER._FieldToJsonObject(field, value)  # noqa: SLF001


_EPOCH_ORDINAL = datetime.date(1970, 1, 1).toordinal()
_SECONDS_MIN, _SECONDS_MAX = -62135596800, 253402300799
# Text by table: "YYYY-MM-DDT" per day seen (bounded), "HH:MM:" per minute of a day, "SS".
_DAY_TEXT: dict[int, str] = {}
_DAYS_KEPT = 4096
_MINUTE_TEXT = [f"{hour:02d}:{minute:02d}:" for hour in range(24) for minute in range(60)]
_TWO_DIGITS = [f"{number:02d}" for number in range(60)]


def _timestamp(value: Any) -> str:
    """Timestamp.ToJsonString by table: no datetime per call (entities carry two each)."""
    seconds, nanos = value.seconds, value.nanos
    if not (_SECONDS_MIN <= seconds <= _SECONDS_MAX and 0 <= nanos < 1_000_000_000):
        raise UnsupportedError
    days, in_day = divmod(seconds, 86400)
    date = _DAY_TEXT.get(days)
    if date is None:
        if len(_DAY_TEXT) >= _DAYS_KEPT:
            _DAY_TEXT.clear()
        date = _DAY_TEXT[days] = datetime.date.fromordinal(_EPOCH_ORDINAL + days).isoformat() + "T"
    minute, second = divmod(in_day, 60)
    text: str = date + _MINUTE_TEXT[minute] + _TWO_DIGITS[second]
    if nanos == 0:
        return text + "Z"
    if nanos % 1_000_000 == 0:
        return f"{text}.{nanos // 1_000_000:03d}Z"
    if nanos % 1000 == 0:
        return f"{text}.{nanos // 1000:06d}Z"
    return f"{text}.{nanos:09d}Z"


def _message_printer(desc: Desc) -> Printer:
    if desc.full_name == "google.protobuf.Timestamp":
        return _timestamp
    if desc.full_name in _JSON_STRING_TYPES:
        return lambda value: value.ToJsonString()
    if desc.full_name in _SPECIAL:
        special: Printer = _PRINTER._MessageToJsonObject  # noqa: SLF001  # json_format's own, on purpose
        return special
    return _to_dict


def _out(desc: Desc) -> _Out:
    plan = _OUT.get(desc)
    if plan is not None:
        return plan
    plan = _Out()
    if desc.full_name in _SPECIAL:
        plan.special = _message_printer(desc)
        _OUT[desc] = plan
        return plan
    for field in desc.fields:
        name = field.name
        if _is_map(field):
            value_printer = _scalar_printer(field.message_type.fields_by_name["value"])
            key_type = field.message_type.fields_by_name["key"].cpp_type
            if key_type == FD.CPPTYPE_BOOL:
                plan.fields[field] = (name, _bool_key_map(value_printer))
            elif value_printer is _identity:
                plan.fields[field] = (name, _plain_map)
            else:
                plan.fields[field] = (name, _map(value_printer))
            if not field.has_presence:
                plan.defaults.append((name, None, dict))
        elif field.is_repeated:
            item = _scalar_printer(field)
            plan.fields[field] = (name, list if item is _identity else _list(item))
            if not field.has_presence:
                plan.defaults.append((name, None, list))
        else:
            printer = _scalar_printer(field)
            plan.fields[field] = (name, None if printer is _identity else printer)
            if not field.has_presence:
                # json_format's own default, through its private printer (on purpose).
                default = _PRINTER._FieldToJsonObject(field, field.default_value)  # noqa: SLF001
                plan.defaults.append((name, default, None))
    # Published only once complete: other threads may convert meanwhile.
    _OUT[desc] = plan
    return plan


# compiled to_dict ----------------------------------------------------------------------
#
# The table walk costs a ListFields (a tuple per set field) and a loop step per field. A
# plain message type is printed instead by a function generated from its table once: one
# attribute read and truth test per field in number order (what ListFields lists: proto3
# fields without presence when not zero or empty, others by HasField or WhichOneof), the
# conversions inline, then the defaults. A type the function could not print in exactly the
# walk's order or with exactly its test keeps the walk: one with extensions, a float or
# double without presence (-0.0 is listed though it tests false), or a oneof whose numbers
# enclose another field's.

_CONVERT: dict[Desc, Printer] = {}


def _converter(desc: Desc) -> Printer:
    convert = _CONVERT.get(desc)
    if convert is None:
        plan = _out(desc)
        convert = _compile(desc, plan) or (lambda msg: _walk(plan, msg))
        _CONVERT[desc] = convert
    return convert


def _read(name: str) -> str:
    """The expression reading field ``name`` of ``msg``."""
    return f"msg.{name}" if name.isidentifier() and not keyword.iskeyword(name) else f"getattr(msg, {name!r})"


def _value(field: Field, printer: Printer | None, env: dict[str, Any]) -> str:
    """The expression converting ``v``, the value of ``field``."""
    if printer is None:
        return "v"
    if printer is str:
        return "str(v)"
    key = f"p{len(env)}"
    plain_enum = field.cpp_type == FD.CPPTYPE_ENUM and not field.is_repeated
    if plain_enum and field.enum_type.full_name != "google.protobuf.NullValue":
        env[key] = _enum_names(field)  # an unknown number: KeyError, so json_format's answer
        return f"{key}[v]"
    env[key] = printer
    return f"{key}(v)"


def _compile(desc: Desc, plan: _Out) -> Printer | None:
    if plan.special is not None or desc.is_extendable:
        return None
    ordered = sorted(desc.fields, key=lambda field: field.number)
    env: dict[str, Any] = {"getattr": getattr, "str": str}
    lines = ["def convert(msg):", " js = {}"]
    done: set[str] = set()
    for field in ordered:
        name, printer = plan.fields[field]
        oneof = field.containing_oneof
        if oneof is not None and len(oneof.fields) > 1:
            if oneof.name in done:
                continue
            done.add(oneof.name)
            numbers = [member.number for member in oneof.fields]
            low, high = min(numbers), max(numbers)
            if any(low < other.number < high and other.containing_oneof is not oneof for other in ordered):
                return None
            key = f"p{len(env)}"
            env[key] = {member.name: plan.fields[member][1] or _identity for member in oneof.fields}
            lines += [
                f" w = msg.WhichOneof({oneof.name!r})",
                " if w is not None:",
                f"  js[w] = {key}[w](getattr(msg, w))",
            ]
        elif field.has_presence:
            value = _value(field, printer, env)
            lines += [f" if msg.HasField({name!r}):", f"  v = {_read(name)}", f"  js[{name!r}] = {value}"]
        elif field.cpp_type in _FLOATS and not field.is_repeated:
            return None
        else:
            lines += [f" v = {_read(name)}", " if v:", f"  js[{name!r}] = {_value(field, printer, env)}"]
    for name, default, factory in plan.defaults:
        key = f"p{len(env)}"
        env[key] = default if factory is None else factory
        lines += [f" if {name!r} not in js:", f"  js[{name!r}] = {key}{'' if factory is None else '()'}"]
    lines.append(" return js")
    exec("\n".join(lines), env)  # built above from descriptor names, each quoted or checked
    convert: Printer = env["convert"]
    return convert


def _plain_map(value: Any) -> dict[str, Any]:
    return {str(key): value[key] for key in value}


def _map(item: Printer) -> Printer:
    return lambda value: {str(key): item(value[key]) for key in value}


def _bool_key_map(item: Printer) -> Printer:
    return lambda value: {("true" if key else "false"): item(value[key]) for key in value}


def _list(item: Printer) -> Printer:
    return lambda value: [item(v) for v in value]


def _to_dict(msg: message.Message) -> Any:
    convert = _CONVERT.get(msg.DESCRIPTOR) or _converter(msg.DESCRIPTOR)
    return convert(msg)


def _walk(plan: _Out, msg: message.Message) -> Any:
    """The table's way: every set field (ListFields, in number order), then the defaults."""
    if plan.special is not None:
        return plan.special(msg)
    fields = plan.fields
    js: dict[str, Any] = {}
    for field, value in msg.ListFields():
        try:
            name, printer = fields[field]
        except KeyError:
            raise UnsupportedError from None  # an extension
        js[name] = value if printer is None else printer(value)
    for name, default, factory in plan.defaults:
        if name not in js:
            js[name] = default if factory is None else factory()
    return js


def to_dict(msg: message.Message) -> dict[str, Any]:
    """json_format.MessageToDict(msg, preserving_proto_field_name=True,
    always_print_fields_with_no_presence=True), or ``UnsupportedError``."""
    try:
        result = _to_dict(msg)
    except UnsupportedError:
        raise
    except Exception:
        raise UnsupportedError from None
    if not isinstance(result, dict):
        raise UnsupportedError
    return result


# from_dict ------------------------------------------------------------------------------

# (field name, kind, oneof name or None, converter); kind says how the value is stored.
_SET, _MESSAGE, _REPEATED, _REPEATED_MESSAGE, _MAP = range(5)
Reader = Callable[[Any], Any]
FieldIn = tuple[str, int, str | None, Any]


def _read_str(value: Any) -> str:
    if type(value) is not str or (not value.isascii() and _SURROGATE.search(value)):
        raise UnsupportedError
    return value


def _read_int(value: Any) -> int:
    if type(value) is int:
        return value
    raise UnsupportedError


def _read_bool(value: Any) -> bool:
    if type(value) is bool:
        return value
    raise UnsupportedError


def _read_double(value: Any) -> float:
    if type(value) is float and value - value == 0.0:  # finite
        return value
    if type(value) is int:
        return float(value)
    raise UnsupportedError


def _enum_reader(field: Field) -> Reader:
    numbers: dict[str, int] = {name: value.number for name, value in field.enum_type.values_by_name.items()}

    def enum(value: Any) -> int:
        if type(value) is str:
            number = numbers.get(value)
            if number is not None:
                return number
        raise UnsupportedError

    return enum


def _scalar_reader(field: Field) -> Reader | None:
    """None: this field type is left to json_format."""
    cpp = field.cpp_type
    if cpp == FD.CPPTYPE_STRING:
        return None if field.type == FD.TYPE_BYTES else _read_str
    if cpp in _INT32 or cpp in _INT64:
        return _read_int
    if cpp == FD.CPPTYPE_BOOL:
        return _read_bool
    if cpp == FD.CPPTYPE_DOUBLE:
        return _read_double
    if cpp == FD.CPPTYPE_ENUM:
        return None if field.enum_type.full_name == "google.protobuf.NullValue" else _enum_reader(field)
    return None


def _delegated(desc: Desc) -> Callable[[Any, message.Message, int], None]:
    """A well-known type parsed by json_format itself, into the field's message."""

    def parse(value: Any, target: message.Message, level: int) -> None:
        if depth(value, _DELEGATE_DEPTH) + level > _DELEGATE_DEPTH:
            raise UnsupportedError
        json_format.ParseDict(value, target, ignore_unknown_fields=False)

    return parse


class _In:
    __slots__ = ("by_key", "delegate")

    def __init__(self) -> None:
        self.by_key: dict[str, FieldIn] = {}
        self.delegate: Callable[[Any, message.Message, int], None] | None = None


_IN: dict[Desc, _In] = {}


def _field_in(field: Field) -> FieldIn:
    oneof = field.containing_oneof.name if field.containing_oneof is not None else None
    if _is_map(field):
        key_field = field.message_type.fields_by_name["key"]
        value_field = field.message_type.fields_by_name["value"]
        reader = _scalar_reader(value_field) if value_field.cpp_type != FD.CPPTYPE_MESSAGE else None
        if key_field.cpp_type != FD.CPPTYPE_STRING or reader is None:
            return (field.name, -1, oneof, None)
        return (field.name, _MAP, oneof, reader)
    if field.cpp_type == FD.CPPTYPE_MESSAGE:
        return (field.name, _REPEATED_MESSAGE if field.is_repeated else _MESSAGE, oneof, field.message_type)
    reader = _scalar_reader(field)
    if reader is None:
        return (field.name, -1, oneof, None)
    return (field.name, _REPEATED if field.is_repeated else _SET, oneof, reader)


def _in(desc: Desc) -> _In:
    plan = _IN.get(desc)
    if plan is not None:
        return plan
    plan = _In()
    if desc.full_name in _SPECIAL:
        plan.delegate = _delegated(desc)
    else:
        # json_format looks a key up by JSON name first, then by proto name.
        for field in desc.fields:
            plan.by_key[field.name] = _field_in(field)
        for field in desc.fields:
            plan.by_key[field.json_name] = _field_in(field)
    _IN[desc] = plan
    return plan


def _fill(data: Any, msg: message.Message, level: int) -> None:
    if type(data) is not dict or level > _DELEGATE_DEPTH:
        raise UnsupportedError
    plan = _IN.get(msg.DESCRIPTOR) or _in(msg.DESCRIPTOR)
    by_key = plan.by_key
    # One key cannot name a field twice (by proto and JSON name) or two of a oneof.
    seen: set[str] | None = set() if len(data) > 1 else None
    for key, value in data.items():
        spec = by_key.get(key)
        if spec is None or value is None:
            raise UnsupportedError
        name, kind, oneof, convert = spec
        if seen is not None:
            if name in seen or (oneof is not None and oneof in seen):
                raise UnsupportedError
            seen.add(name)
            if oneof is not None:
                seen.add(oneof)
        if kind == _SET:
            setattr(msg, name, convert(value))
        elif kind == _MESSAGE:
            _fill_message(value, getattr(msg, name), convert, level + 1)
        elif kind == _REPEATED:
            if type(value) is not list:
                raise UnsupportedError
            getattr(msg, name).extend([convert(item) for item in value])
        elif kind == _REPEATED_MESSAGE:
            if type(value) is not list:
                raise UnsupportedError
            items = getattr(msg, name)
            for item in value:
                if item is None:
                    raise UnsupportedError
                _fill_message(item, items.add(), convert, level + 2)
        elif kind == _MAP:
            if type(value) is not dict:
                raise UnsupportedError
            target = getattr(msg, name)
            for map_key, item in value.items():
                target[_read_str(map_key)] = convert(item)
        else:
            raise UnsupportedError


def _fill_message(value: Any, target: message.Message, desc: Desc, level: int) -> None:
    plan = _IN.get(desc) or _in(desc)
    # json_format marks the field present first, so an empty value still sets it.
    target.SetInParent()
    if plan.delegate is not None:
        plan.delegate(value, target, level)
        return
    _fill(value, target, level)


def from_dict(data: Any, msg: message.Message) -> None:
    """Fill the fresh ``msg`` as json_format.ParseDict(data, msg) would, or raise
    ``UnsupportedError`` (the message may then be partly filled: discard it)."""
    try:
        _fill(data, msg, 1)
    except UnsupportedError:
        raise
    except Exception:
        raise UnsupportedError from None
