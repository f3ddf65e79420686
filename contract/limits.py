"""The bounds on what callers send, in one place, checked once below every transport.

The facade runs ``check_bounds`` on every request (after the required fields), so a map with
too many entries or an identifier too long is the same INVALID_PARAMS on the local, HTTP and
gRPC paths. Which fields a bound applies to is read from the descriptors once per message
type: every map field (labels), and the identifier fields, named by the proto's convention
(``name``, ``namespace``, ``*_id``, the registry references such as ``project`` or
``actor``). Sizes of whole requests, headers and connections are the transports' (their
defaults are here too); docs/server.md lists them all.
"""

from __future__ import annotations

from functools import cache

from google.protobuf import descriptor, message

from cleveragents.acp.contract.errors import ACPError, ErrorCode

# Entries of one map field (labels, label filters).
MAX_MAP_ENTRIES = 64
# Characters of a map key and of a map value.
MAX_MAP_KEY_CHARS = 63
MAX_MAP_VALUE_CHARS = 256
# Characters of an identifier: a name, a namespace, an id, a reference to a registry entry.
MAX_NAME_CHARS = 256
# Items of a repeated identifier field (event type filters, skills, allowed tools).
MAX_NAME_ITEMS = 1024

# The transports' defaults (each is a setting of `agents serve`; docs/server.md).
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
# The gRPC runtime refuses by itself (bare RESOURCE_EXHAUSTED) past this many times our limit.
GRPC_RUNTIME_FACTOR = 4
DEFAULT_MAX_HEADER_BYTES = 64 * 1024
# A session export document, as JSON and as protobuf: session.export makes none larger, and
# session.import takes requests up to ``import_limit`` on every transport (past the body
# limit), so whatever export made imports again (issue 17, finding 9).
MAX_SESSION_DOCUMENT_BYTES = 32 * 1024 * 1024
IMPORT_OPERATION = "session.import"
# Room for what travels around the document: the envelope, new_id, namespace.
_DOCUMENT_SLACK_BYTES = 64 * 1024
# Requests over the body limit (imports) read at once by one server; more wait their turn.
MAX_LARGE_BODIES = 2


def import_limit(max_body_bytes: int) -> int:
    """How large a session.import request may be: the body limit, or a whole export document."""
    return max(max_body_bytes, MAX_SESSION_DOCUMENT_BYTES + _DOCUMENT_SLACK_BYTES)


# Seconds for a request's headers to arrive (from the connection or the previous response),
# then for its body; seconds an idle keep-alive connection stays open.
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 60.0
DEFAULT_IDLE_TIMEOUT = 5
# A request body must average this many bytes a second since its headers, once this many
# seconds have passed (Kestrel's MinRequestBodyDataRate): a trickled body gives its place up
# in seconds rather than at the body timeout.
MIN_BODY_RATE = 240
MIN_BODY_RATE_GRACE = 5.0
DEFAULT_MAX_CONNECTIONS = 2048
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 256

# Identifier fields besides ``name``, ``namespace`` and ``*_id``.
_IDENTIFIERS = frozenset(
    {
        "name",
        "namespace",
        "project",
        "actor",
        "orchestrator",
        "action",
        "resource",
        "automation_profile",
        "tool",
        "type",
        "provider",
        "driver",
        "model",
        "event_type",
        "skills",
        "validations",
        "invariants",
        "resources",
        "allowed_tools",
    }
)

_MAP, _NAME, _NAMES, _MESSAGE, _MESSAGES = range(5)
Check = tuple[str, int, "tuple[Check, ...]"]


def _is_identifier(field: descriptor.FieldDescriptor) -> bool:
    return field.type == descriptor.FieldDescriptor.TYPE_STRING and (
        field.name in _IDENTIFIERS or field.name.endswith("_id")
    )


def _is_map(field: descriptor.FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


@cache
def _checks(desc: descriptor.Descriptor) -> tuple[Check, ...]:
    """The bounded fields of a message type and of the messages it holds (cycles end where
    they start: a message type is visited once per path)."""
    return _build(desc, frozenset())


def _build(desc: descriptor.Descriptor, visiting: frozenset[str]) -> tuple[Check, ...]:
    if desc.full_name.startswith("google.protobuf."):
        return ()
    visiting = visiting | {desc.full_name}
    found: list[Check] = []
    for field in desc.fields:
        if _is_map(field):
            found.append((field.name, _MAP, ()))
        elif _is_identifier(field):
            found.append((field.name, _NAMES if field.is_repeated else _NAME, ()))
        elif field.message_type is not None and field.message_type.full_name not in visiting:
            inner = _build(field.message_type, visiting)
            if inner:
                found.append((field.name, _MESSAGES if field.is_repeated else _MESSAGE, inner))
    return tuple(found)


def _refuse(path: str, text: str, **details: int) -> ACPError:
    return ACPError(ErrorCode.INVALID_PARAMS, f"{path} {text}", {"field": path, **details})


def _check_map(path: str, entries: dict[str, object]) -> None:
    if len(entries) > MAX_MAP_ENTRIES:
        raise _refuse(
            path, f"has {len(entries)} entries; the limit is {MAX_MAP_ENTRIES}", max_entries=MAX_MAP_ENTRIES
        )
    for key, value in entries.items():
        if len(key) > MAX_MAP_KEY_CHARS:
            raise _refuse(
                f"{path}.{key[:MAX_MAP_KEY_CHARS]}…",
                f"is a key over {MAX_MAP_KEY_CHARS} characters",
                max_chars=MAX_MAP_KEY_CHARS,
            )
        if isinstance(value, str) and len(value) > MAX_MAP_VALUE_CHARS:
            raise _refuse(
                f"{path}.{key}", f"is over {MAX_MAP_VALUE_CHARS} characters", max_chars=MAX_MAP_VALUE_CHARS
            )


def _check_name(path: str, value: str) -> None:
    if len(value) > MAX_NAME_CHARS:
        raise _refuse(
            path, f"is {len(value)} characters; the limit is {MAX_NAME_CHARS}", max_chars=MAX_NAME_CHARS
        )


def _check(msg: message.Message, checks: tuple[Check, ...], prefix: str) -> None:
    for name, kind, inner in checks:
        value = getattr(msg, name)
        if kind == _NAME:
            if len(value) > MAX_NAME_CHARS:
                _check_name(prefix + name, value)
        elif kind == _MAP:
            if value:
                _check_map(prefix + name, dict(value))
        elif kind == _NAMES:
            if len(value) > MAX_NAME_ITEMS:
                raise _refuse(
                    prefix + name,
                    f"has {len(value)} items; the limit is {MAX_NAME_ITEMS}",
                    max_items=MAX_NAME_ITEMS,
                )
            for index, item in enumerate(value):
                _check_name(f"{prefix}{name}[{index}]", item)
        elif kind == _MESSAGE:
            if msg.HasField(name):
                _check(value, inner, f"{prefix}{name}.")
        else:
            for index, item in enumerate(value):
                _check(item, inner, f"{prefix}{name}[{index}].")


# Each message type's checks by its class (cheaper to look up than by descriptor).
_BY_TYPE: dict[type[message.Message], tuple[Check, ...]] = {}


def check_bounds(msg: message.Message) -> None:
    """INVALID_PARAMS naming the first field over its bound (``details.field``)."""
    checks = _BY_TYPE.get(type(msg))
    if checks is None:
        checks = _BY_TYPE[type(msg)] = _checks(msg.DESCRIPTOR)
    if checks:
        _check(msg, checks, "")
