"""Required fields, read from the ``google.api.field_behavior`` annotations of the proto.

Checked once below every transport, so a missing identifier is the same INVALID_PARAMS
on the local, HTTP and gRPC paths.
"""

from __future__ import annotations

from functools import cache

from google.api import field_behavior_pb2
from google.protobuf import descriptor, message

from cleveragents.acp.facade.contract.errors import ACPError, ErrorCode


@cache
def required_fields(desc: descriptor.Descriptor) -> tuple[descriptor.FieldDescriptor, ...]:
    found = []
    for field in desc.fields:
        behaviors = field.GetOptions().Extensions[field_behavior_pb2.field_behavior]
        if field_behavior_pb2.REQUIRED in behaviors:
            found.append(field)
    return tuple(found)


def _is_set(msg: message.Message, field: descriptor.FieldDescriptor) -> bool:
    if field.is_repeated:
        return len(getattr(msg, field.name)) > 0
    if field.message_type is not None:
        return msg.HasField(field.name)
    return bool(getattr(msg, field.name))


def check_required(msg: message.Message) -> None:
    missing = [f.name for f in required_fields(msg.DESCRIPTOR) if not _is_set(msg, f)]
    if missing:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"missing required field{'s' if len(missing) > 1 else ''}: {', '.join(missing)}",
            {"missing_fields": missing, "message_type": msg.DESCRIPTOR.full_name},
        )
