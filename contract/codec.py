"""The one proto <-> JSON conversion of ACP, with one set of options.

JSON uses proto field names (``plan_id``), prints fields without presence even when they
hold their default (states, counts, empty lists), and follows proto3 JSON for the rest:
int64 values are strings, enums are their value names, Timestamps RFC 3339 strings.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

from google.protobuf import descriptor, json_format, message

from cleveragents.acp.contract import codec_fast, json_shape
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.contract.json_depth import MAX_DEPTH, depth

M = TypeVar("M", bound=message.Message)


def to_dict(msg: message.Message) -> dict[str, Any]:
    try:
        return codec_fast.to_dict(msg)
    except codec_fast.UnsupportedError:
        pass
    return json_format.MessageToDict(
        msg,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )


def from_dict(data: Any, cls: type[M], *, what: str = "params") -> M:
    """Parse JSON params into a request message, or raise INVALID_PARAMS saying why."""
    fast = cls()
    try:
        codec_fast.from_dict(data, fast)
        return fast
    except codec_fast.UnsupportedError:
        pass
    if not isinstance(data, dict):
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"{what} must be a JSON object, not {type(data).__name__}",
            {"field": what},
        )
    if depth(data) > MAX_DEPTH:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"{what} is nested deeper than {MAX_DEPTH} levels",
            {"field": what, "max_depth": MAX_DEPTH},
        )
    try:
        return json_format.ParseDict(data, cls(), ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise _invalid(data, cls, what, exc) from None


def _invalid(data: dict[str, Any], cls: type[message.Message], what: str, exc: Exception) -> ACPError:
    """INVALID_PARAMS naming the field path and what it takes (or the fields there are),
    in ACP's words; protobuf's text only when the shape fits and a value is wrong."""
    details: dict[str, Any] = {"field": what, "message_type": cls.DESCRIPTOR.full_name}
    misfit = json_shape.explain(data, cast(descriptor.Descriptor, cls.DESCRIPTOR))
    if misfit is not None:
        details["path"] = misfit.path
        if misfit.allowed:
            details["allowed"] = list(misfit.allowed)
        return ACPError(ErrorCode.INVALID_PARAMS, f"invalid {what}: {misfit}", details)
    text = " ".join(str(exc).split())
    return ACPError(ErrorCode.INVALID_PARAMS, f"invalid {what}: {text}", details)


def response_from_dict(data: Any, cls: type[M]) -> M:
    """A response read by a client: fields it does not know (a newer server) are skipped,
    as protobuf's binary form does; anything else unreadable is the server's fault."""
    fast = cls()
    try:
        codec_fast.from_dict(data, fast)
        return fast
    except codec_fast.UnsupportedError:
        pass
    try:
        return json_format.ParseDict(data, cls(), ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        raise ACPError(
            ErrorCode.INTERNAL_ERROR,
            f"unreadable {cls.DESCRIPTOR.full_name} from the server: {exc}",
            {"message_type": cls.DESCRIPTOR.full_name},
        ) from None
