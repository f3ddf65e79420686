"""``--value PATH`` checked against the response's descriptor before the call is sent, so a
typo is a usage error (exit 2) before a mutating call changes anything, not after."""

from __future__ import annotations

from google.protobuf import descriptor

# JSON leaves (a string or number in the response data): nothing can follow them.
_SCALAR_MESSAGES = frozenset(
    {
        "google.protobuf.Timestamp",
        "google.protobuf.Duration",
        "google.protobuf.FieldMask",
        "google.protobuf.StringValue",
        "google.protobuf.BytesValue",
        "google.protobuf.BoolValue",
        "google.protobuf.Int32Value",
        "google.protobuf.Int64Value",
        "google.protobuf.UInt32Value",
        "google.protobuf.UInt64Value",
        "google.protobuf.FloatValue",
        "google.protobuf.DoubleValue",
    }
)
# Free-form JSON: any path below them may exist.
_FREE_FORM = frozenset(
    {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue", "google.protobuf.Any"}
)


def problem(message: descriptor.Descriptor, path: str) -> str | None:
    """Why ``path`` can name nothing in a ``message`` response, or None when it can."""
    parts = path.split(".")
    current: descriptor.Descriptor | None = message
    index = 0
    while index < len(parts):
        part = parts[index]
        if current is None:
            return f"--value {path}: {'.'.join(parts[:index])} is a single value; nothing is below it"
        if current.full_name in _FREE_FORM:
            return None
        field = current.fields_by_name.get(part)
        if field is None:
            known = ", ".join(sorted(current.fields_by_name)) or "(none)"
            where = ".".join(parts[:index]) or "the response"
            return f"--value {path}: {where} has no field {part!r} (it has: {known})"
        index += 1
        entry = field.message_type
        if entry is not None and entry.GetOptions().map_entry:
            if index < len(parts):
                index += 1  # any key
            current = _below(entry.fields_by_name["value"])
            continue
        if field.is_repeated and index < len(parts):
            if not parts[index].isdigit():
                return f"--value {path}: {field.name} is a list; expected an index such as {field.name}.0"
            index += 1
        current = _below(field)
    return None


def _below(field: descriptor.FieldDescriptor) -> descriptor.Descriptor | None:
    """The message a path may continue into, or None for a JSON leaf."""
    if field.message_type is None or field.message_type.full_name in _SCALAR_MESSAGES:
        return None
    return field.message_type
