"""What a client of an older minor version may see and send: the contract's surface per version.

Operations carry ``since`` in their ``(operation)`` option; fields carry it in the ``(since)``
field option, and a member of ``Event.payload`` dates its event type. A client speaking an
older minor (1.1 while 1.2 is current) gets responses and events with the newer fields
cleared, never receives a newer event type, and is refused (VERSION_MISMATCH) when it sets a
newer field or asks for a newer event type. Clients of the current version pay one string
comparison: everything here is decided per message type and version once, and a message is
copied only when its type can hold a newer field.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import MappingProxyType

from google.protobuf import descriptor, message

from cleveragents.acp.contract import versions
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.v1 import events_pb2, options_pb2

_FieldDescriptor = descriptor.FieldDescriptor


def field_since(field: _FieldDescriptor) -> str | None:
    """The version a field's ``(since)`` option names; None when it has none."""
    options = field.GetOptions()
    if not options.HasExtension(options_pb2.since):
        return None
    since: str = options.Extensions[options_pb2.since]
    return since


# Event type (`plan.phase_changed`) -> the minor that introduced it, from `Event.payload`.
EVENT_TYPE_SINCE: Mapping[str, str] = MappingProxyType(
    {
        field.name.replace("_", ".", 1): field_since(field) or "1.0"
        for field in events_pb2.Event.DESCRIPTOR.oneofs_by_name["payload"].fields
    }
)


def _value_type(field: _FieldDescriptor) -> descriptor.Descriptor | None:
    """The message type a field holds (a map's value type for a map), or None."""
    if field.message_type is None:
        return None
    if field.message_type.GetOptions().map_entry:
        return field.message_type.fields_by_name["value"].message_type
    return field.message_type


def _is_map(field: _FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


@functools.cache
def _newer_fields(message_type: descriptor.Descriptor, version: str) -> frozenset[str]:
    return frozenset(
        field.name
        for field in message_type.fields
        if (since := field_since(field)) is not None and versions.newer(since, version)
    )


@functools.cache
def holds_newer(message_type: descriptor.Descriptor, version: str) -> bool:
    """Whether a message of this type, at any depth, can hold a field newer than ``version``."""
    seen: set[str] = set()
    pending = [message_type]
    while pending:
        current = pending.pop()
        if current.full_name in seen:
            continue
        seen.add(current.full_name)
        if _newer_fields(current, version):
            return True
        pending.extend(t for field in current.fields if (t := _value_type(field)) is not None)
    return False


def _clear_newer(msg: message.Message, version: str) -> None:
    newer = _newer_fields(msg.DESCRIPTOR, version)
    for field, value in msg.ListFields():
        if field.name in newer:
            msg.ClearField(field.name)
            continue
        inner = _value_type(field)
        if inner is None or not holds_newer(inner, version):
            continue
        if _is_map(field):
            items: Iterable[message.Message] = value.values()
        elif field.is_repeated:
            items = value
        else:
            items = (value,)
        for item in items:
            _clear_newer(item, version)


def strip(msg: message.Message, version: str) -> message.Message:
    """``msg`` as a client of ``version`` may see it: itself when nothing in it can be newer,
    else a copy without the newer fields (the original may be shared, e.g. by subscribers)."""
    if version == versions.CURRENT or not holds_newer(msg.DESCRIPTOR, version):
        return msg
    copy = type(msg)()
    copy.CopyFrom(msg)
    _clear_newer(copy, version)
    return copy


def _newer_set_fields(msg: message.Message, version: str, path: str) -> Iterator[tuple[str, str]]:
    newer = _newer_fields(msg.DESCRIPTOR, version)
    for field, value in msg.ListFields():
        where = f"{path}.{field.name}" if path else field.name
        if field.name in newer:
            yield where, field_since(field) or versions.CURRENT
            continue
        inner = _value_type(field)
        if inner is None or not holds_newer(inner, version):
            continue
        if _is_map(field):
            entries: Iterable[tuple[str, message.Message]] = ((f"{where}[{k}]", v) for k, v in value.items())
        elif field.is_repeated:
            entries = ((f"{where}[{i}]", v) for i, v in enumerate(value))
        else:
            entries = ((where, value),)
        for item_path, item in entries:
            yield from _newer_set_fields(item, version, item_path)


def check_request(msg: message.Message, version: str) -> None:
    """Refuse a request that sets a field its version does not have."""
    if version == versions.CURRENT or not holds_newer(msg.DESCRIPTOR, version):
        return
    for where, since in _newer_set_fields(msg, version, ""):
        raise ACPError(
            ErrorCode.VERSION_MISMATCH,
            f"field {where} was introduced in ACP {since}; the request speaks {version}",
            {
                "field": where,
                "since": since,
                "requested": version,
                "supported_versions": list(versions.SUPPORTED),
            },
        )


def event_types(
    version: str, requested: Sequence[str], since_of: Mapping[str, str] = EVENT_TYPE_SINCE
) -> list[str]:
    """The event types a subscriber of ``version`` receives: those it asked for (a newer one is
    VERSION_MISMATCH), or, when it asked for none, every type its version knows — empty (all)
    when that is every type there is. Unknown names are left for the event log to refuse."""
    for name in requested:
        since = since_of.get(name)
        if since is not None and versions.newer(since, version):
            raise ACPError(
                ErrorCode.VERSION_MISMATCH,
                f"event type {name} was introduced in ACP {since}; the request speaks {version}",
                {
                    "field": "event_type",
                    "event_type": name,
                    "since": since,
                    "requested": version,
                    "supported_versions": list(versions.SUPPORTED),
                },
            )
    if requested:
        return list(requested)
    known = sorted(name for name, since in since_of.items() if not versions.newer(since, version))
    return [] if len(known) == len(since_of) else known


def check_versions(
    files: Iterable[descriptor.FileDescriptor], table: versions.VersionTable = versions.V1
) -> list[str]:
    """Problems with the ``(since)`` options of every message in ``files``: a version that
    ``table``'s major never released or is newer than its current one."""
    problems: list[str] = []

    def visit(message_type: descriptor.Descriptor) -> None:
        for field in message_type.fields:
            since = field_since(field)
            if since is not None and (since not in table.released or versions.newer(since, table.current)):
                problems.append(
                    f"{field.full_name}: (since) {since!r} is not a released version of ACP {table.major}"
                )
        for nested in message_type.nested_types:
            visit(nested)

    for file in files:
        for message_type in file.message_types_by_name.values():
            visit(message_type)
    return problems
