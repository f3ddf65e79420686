"""The canonical JSON envelope of ADR-026, whose schema is ``RequestEnvelope`` and
``ResponseEnvelope`` in envelope.proto.

Responses are built as plain dicts in the proto's JSON shape (``data`` and ``error`` are
JSON null when absent), because they sit on every request's path.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from cleveragents.acp.contract import revisions
from cleveragents.acp.contract.errors import ACPError, ErrorCode

REQUEST_FIELDS = frozenset({"acp_version", "request_id", "operation", "params", "auth", "if_revision"})


@dataclass(frozen=True)
class Request:
    acp_version: str | None
    # None when the envelope names none: the server makes the call's one id, once.
    request_id: str | None
    operation: str
    params: dict[str, Any]
    token: str | None
    # The revision the caller read of the session or plan it mutates (ACP 1.3).
    if_revision: int | None = None


# Two characters of Crockford's base32 (the ULID alphabet) per 10 bits.
_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
_PAIRS = [a + b for a in _ALPHABET for b in _ALPHABET]
_SHIFTS = tuple(range(120, -1, -10))
# Within one millisecond ids are monotonic, as the ULID spec allows: the first takes 80
# random bits, the next ones add one to its low 20 bits. The millisecond, the text of the
# first 24 characters and the counter are kept as one tuple, replaced in one assignment.
_LOW_BITS = 20
_state: tuple[int, str, Iterator[int]] = (-1, "", iter(()))


def new_request_id() -> str:
    """A ULID (48-bit milliseconds, 80 random bits) as 26 characters. It is on every call's
    path, hence built by table (python-ulid takes 4 µs), and within a millisecond from the
    text of the first. Request ids correlate, they are no secret: the random bits need not
    come from the OS."""
    global _state
    ms = time.time_ns() // 1_000_000
    state = _state
    if state[0] == ms:
        low = next(state[2])
        if low < 1 << _LOW_BITS:
            return state[1] + _PAIRS[low >> 10] + _PAIRS[low & 1023]
    value = ms << 80 | random.getrandbits(80)
    text = "".join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])
    low = value & ((1 << _LOW_BITS) - 1)
    _state = (ms, text[:-4], itertools.count(low + 1))
    return text


def ok(acp_version: str, request_id: str, data: dict[str, Any], duration_ms: float) -> dict[str, Any]:
    return {
        "acp_version": acp_version,
        "request_id": request_id,
        "status": "ok",
        "data": data,
        "error": None,
        "timing": {"duration_ms": round(duration_ms, 3)},
    }


def error(acp_version: str, request_id: str, err: ACPError, duration_ms: float) -> dict[str, Any]:
    return {
        "acp_version": acp_version,
        "request_id": request_id,
        "status": "error",
        "data": None,
        "error": {"code": err.code, "message": err.message, "details": err.details},
        "timing": {"duration_ms": round(duration_ms, 3)},
    }


def _invalid(message: str, field: str) -> ACPError:
    return ACPError(ErrorCode.INVALID_PARAMS, message, {"field": field})


def _optional_str(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _invalid(f"{key} must be a string", key)
    return value


def parse_request(body: Any) -> Request:
    """Validate a request envelope's shape; the params are parsed later, per operation."""
    if not isinstance(body, dict):
        raise _invalid(f"the request envelope must be a JSON object, not {type(body).__name__}", "envelope")
    if not REQUEST_FIELDS.issuperset(body):
        unknown = sorted(set(body) - REQUEST_FIELDS)
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"unknown envelope field{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}",
            {"field": "envelope", "unknown_fields": unknown},
        )
    operation = _optional_str(body, "operation")
    if not operation:
        raise _invalid("operation is required", "operation")
    params = body.get("params")
    if params is None:
        params = {}
    elif not isinstance(params, dict):
        raise _invalid("params must be a JSON object", "params")
    auth = body.get("auth")
    token = None
    if auth is not None:
        if not isinstance(auth, dict) or set(auth) - {"token"}:
            raise _invalid('auth must be an object {"token": "..."}', "auth")
        token = _optional_str(auth, "token")
    if_revision = body.get("if_revision")
    if if_revision is not None:
        # proto3 JSON: an int32 is a number, or a string of one.
        if isinstance(if_revision, str) and if_revision.isascii() and if_revision.isdecimal():
            if_revision = int(if_revision)
        if_revision = revisions.checked(if_revision, "if_revision")
    return Request(
        acp_version=_optional_str(body, "acp_version"),
        request_id=_optional_str(body, "request_id") or None,
        operation=operation,
        params=params,
        token=token,
        if_revision=if_revision,
    )


def raise_for_error(envelope: dict[str, Any]) -> dict[str, Any]:
    """A client's view of a response envelope: its data, or the ACPError it carries."""
    if envelope.get("status") == "ok":
        data = envelope.get("data")
        return data if isinstance(data, dict) else {}
    err = envelope.get("error") or {}
    code = err.get("code", "INTERNAL_ERROR")
    try:
        return_error = ACPError(code, str(err.get("message", "")), err.get("details") or {})
    except ValueError:
        return_error = ACPError(
            ErrorCode.INTERNAL_ERROR, f"unknown error code {code!r}: {err.get('message')}"
        )
    raise return_error
