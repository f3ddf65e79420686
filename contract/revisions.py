"""Expected revisions on the wire (ACP 1.3), one reading for every transport.

An operation whose proto option names ``if_revision`` (``session``, ``plan``) mutates one
object and takes the revision its caller read: the envelope's ``if_revision``, gRPC
metadata ``acp-if-revision``, HTTP ``If-Match: "<revision>"`` or the in-process client's
``CallOptions(if_revision=...)``. Each transport only parses it into
``CallContext.if_revision``; the facade refuses one on any other operation (INVALID_PARAMS),
and the domain checks it in the mutation's own transaction (facade/domain/revisions.py).
REST reads of one session or plan answer ``ETag: "<revision>"``.
"""

from __future__ import annotations

import re

from google.protobuf import message

from cleveragents.acp.contract import versions
from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError, ErrorCode

SINCE = "1.3"
METADATA = "acp-if-revision"
# Revisions are int32 in the proto.
MAX_REVISION = 2**31 - 1
# One strong entity tag (RFC 9110): a quoted decimal revision.
_ETAG = re.compile(r'"([1-9][0-9]{0,9})"')
_DECIMAL = re.compile(r"[1-9][0-9]{0,9}")


def _invalid(field: str, message: str) -> ACPError:
    return ACPError(ErrorCode.INVALID_PARAMS, message, {"field": field})


def checked(value: int, field: str) -> int:
    """A revision as given (a positive int32), or INVALID_PARAMS naming where it came from."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_REVISION:
        raise _invalid(field, f"{field} is a revision: a whole number from 1 to {MAX_REVISION}")
    return value


def parse_metadata(text: str) -> int:
    """gRPC ``acp-if-revision``: a decimal revision."""
    if not _DECIMAL.fullmatch(text.strip()):
        raise _invalid(METADATA, f"{METADATA} is a revision (a whole number from 1), not {text[:40]!r}")
    return checked(int(text.strip()), METADATA)


def parse_if_match(text: str) -> int:
    """HTTP ``If-Match``: one strong entity tag as ``etag`` makes them (``"7"``). A list,
    ``*`` or a weak tag (``W/"7"``) names no single revision: INVALID_PARAMS."""
    found = _ETAG.fullmatch(text.strip())
    if found is None:
        raise _invalid(
            "If-Match",
            f'If-Match takes one entity tag of a session or plan read, such as "7"; not {text[:40]!r}',
        )
    return checked(int(found.group(1)), "If-Match")


def etag(revision: int) -> str:
    """The ``ETag`` of a session or plan at ``revision``."""
    return f'"{revision}"'


def check_operation(op: Operation, ctx: CallContext) -> None:
    """Refuse an expected revision on an operation that takes none, or at a version before
    revisions (once the version is negotiated)."""
    if not op.if_revision:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"{op.name} takes no expected revision (if_revision, If-Match): only a mutation of one "
            "session or plan does",
            {"field": "if_revision", "operation": op.name},
        )
    if ctx.served_version and versions.newer(SINCE, ctx.served_version):
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"if_revision is part of ACP {SINCE}; this call speaks ACP {ctx.served_version}",
            {"field": "if_revision", "since": SINCE},
        )


REVISION_MISMATCH = "REVISION_MISMATCH"
# HTTP's answer to a stale If-Match (RFC 9110 §13.1.1); without If-Match the category's 409.
PRECONDITION_FAILED = 412
_ENTITY_FIELDS = {"session": "Session", "plan": "Plan"}
# Response type -> the field holding the one session or plan it carries ("" for none).
_entity_field: dict[type[message.Message], str] = {}


def _field_of(response_type: type[message.Message]) -> str:
    found = _entity_field.get(response_type)
    if found is None:
        found = ""
        fields = response_type.DESCRIPTOR.fields_by_name
        for name, type_name in _ENTITY_FIELDS.items():
            field = fields.get(name)
            if field is not None and field.message_type is not None and field.message_type.name == type_name:
                found = name
                break
        _entity_field[response_type] = found
    return found


def carried_revision(response: message.Message) -> int | None:
    """The revision of the one session or plan an answer carries (its REST ``ETag``), if any."""
    name = _field_of(type(response))
    if not name or not response.HasField(name):
        return None
    revision: int = getattr(response, name).revision
    return revision or None


def carries_entity(response_type: type[message.Message]) -> bool:
    """Whether answers of this type carry one session or plan (the OpenAPI ``ETag``)."""
    return bool(_field_of(response_type))


def is_mismatch(err: ACPError) -> bool:
    return err.details.get("refinement") == REVISION_MISMATCH
