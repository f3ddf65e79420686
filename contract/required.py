"""Required fields, read from the ``google.api.field_behavior`` annotations of the proto.

Checked once below every transport, so a missing identifier is the same INVALID_PARAMS
on the local, HTTP and gRPC paths.
"""

from __future__ import annotations

from functools import cache

from google.api import field_behavior_pb2
from google.protobuf import descriptor, message

from cleveragents.acp.contract.errors import ACPError, ErrorCode


@cache
def required_fields(desc: descriptor.Descriptor) -> tuple[descriptor.FieldDescriptor, ...]:
    found = []
    for field in desc.fields:
        behaviors = field.GetOptions().Extensions[field_behavior_pb2.field_behavior]
        if field_behavior_pb2.REQUIRED in behaviors:
            found.append(field)
    return tuple(found)


# How a required field is tested: its length (repeated), HasField (message), truth (scalar).
_LENGTH, _PRESENCE, _TRUTH = range(3)


@cache
def _checks(desc: descriptor.Descriptor) -> tuple[tuple[str, int], ...]:
    """Each required field's name and test, read from descriptors once per message type."""
    checks = []
    for field in required_fields(desc):
        test = _LENGTH if field.is_repeated else _PRESENCE if field.message_type is not None else _TRUTH
        checks.append((field.name, test))
    return tuple(checks)


def _is_set(msg: message.Message, name: str, test: int) -> bool:
    if test == _LENGTH:
        return len(getattr(msg, name)) > 0
    if test == _PRESENCE:
        return msg.HasField(name)
    return bool(getattr(msg, name))


# Each message type's checks by its class: a dict lookup by type costs a fifth of the
# cache lookup by descriptor (hashing a descriptor), and check_required runs on every call.
_BY_TYPE: dict[type[message.Message], tuple[tuple[str, int], ...]] = {}


def check_required(msg: message.Message) -> None:
    checks = _BY_TYPE.get(type(msg))
    if checks is None:
        checks = _BY_TYPE[type(msg)] = _checks(msg.DESCRIPTOR)
    for name, test in checks:
        if not _is_set(msg, name, test):
            missing = [name for name, test in checks if not _is_set(msg, name, test)]
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                f"missing required field{'s' if len(missing) > 1 else ''}: {', '.join(missing)}",
                {"missing_fields": missing, "message_type": msg.DESCRIPTOR.full_name},
            )
