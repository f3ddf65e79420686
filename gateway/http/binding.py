"""From an HTTP request to JSON params: a bounded body, strict JSON, and the
``google.api.http`` binding of path variables, query parameters and body.

Every refusal is an ``ACPError`` (INVALID_PARAMS naming the field), never a framework error.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import orjson
from google.protobuf import descriptor
from starlette.requests import Request

from cleveragents.acp.contract import limits, strict_json
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.gateway import common

DEFAULT_MAX_BODY_BYTES = limits.DEFAULT_MAX_BODY_BYTES
# Well-known types that proto3 JSON writes as one string, so a query value can carry them.
# ``labels[team]``: a map entry in OpenAPI's deepObject style.
_BRACKETED = re.compile(r"([a-z_][a-z0-9_.]*)\[([^\]]*)\]")
_STRING_MESSAGES = frozenset(
    {"google.protobuf.Timestamp", "google.protobuf.Duration", "google.protobuf.FieldMask"}
)


# Credentials in URLs end up in logs, proxies and browser history: refused on purpose, with
# what to do instead.
CREDENTIAL_PARAMETERS = frozenset({"token", "access_token", "bearer", "auth", "authorization"})
CREDENTIAL_REFUSAL = (
    "query parameter {key!r}: tokens in URLs are refused on purpose (they end up in logs and "
    "browser history); send the header 'Authorization: Bearer TOKEN', or, for a browser's "
    "EventSource on /api/v1/events/stream, get a one-use stream ticket (POST /api/v1/events/ticket) "
    "and pass ?ticket=..."
)


def invalid(message: str, field: str, **details: Any) -> ACPError:
    return ACPError(ErrorCode.INVALID_PARAMS, message, {"field": field, **details})


class PeerGoneError(Exception):
    """The client left before its request body arrived."""


def header(request: Request, name: bytes) -> str | None:
    """A request header by its lower-case name, as Starlette's ``Headers.get`` finds it
    (the first of that name), read from the scope without building a Headers object."""
    for key, value in request.scope["headers"]:
        if key == name:
            return cast(bytes, value).decode("latin-1")
    return None


def header_values(request: Request, name: bytes) -> list[str]:
    """Every value of a request header, by its lower-case name, in order."""
    return [cast(bytes, value).decode("latin-1") for key, value in request.scope["headers"] if key == name]


@dataclass
class LargeBodies:
    """What a body past the body limit may reach (a session.import), and the process's
    places for such requests (``common.large_requests``, shared with gRPC): a request past the
    limit, once its caller is verified from its headers (``read_body``'s ``admit``), waits for
    one before reading on, and holds it until its answer (``release``), so
    callers cannot make the server hold many at once (a waiting one holds only what the
    connection buffered)."""

    limit: int
    _holders: set[asyncio.Task[Any]] = field(default_factory=set)

    async def hold(self) -> None:
        await common.large_requests().acquire()
        task = asyncio.current_task()
        if task is not None:
            self._holders.add(task)

    def release(self) -> None:
        """The place the current request holds, if it holds one."""
        task = asyncio.current_task()
        if task in self._holders:
            self._holders.discard(task)
            common.large_requests().release()


# The check of a large body's caller, from its headers (``Gateway._admit_large``).
Admit = Callable[[], Awaitable[None]]


def over_limit(limit: int, declared: str | None = None) -> ACPError:
    if declared is not None:
        return invalid(f"the request body is {declared} bytes; the limit is {limit}", "body", max_bytes=limit)
    return invalid(f"the request body is over the limit of {limit} bytes", "body", max_bytes=limit)


async def read_body(
    request: Request, limit: int, large: LargeBodies | None = None, admit: Admit | None = None
) -> bytes:
    """The request body, refused once it passes ``limit`` bytes (without reading the rest);
    with ``large``, up to ``large.limit`` bytes, holding one of its slots past ``limit``.
    ``admit`` verifies the caller of a body past ``limit`` before it takes a slot: before any
    of the body is read when its declared length is past ``limit``, else (chunked) once it
    passes it; a caller it refuses never holds a slot (issue 31, failure 7)."""
    cap = limit if large is None else large.limit
    declared = header(request, b"content-length")
    if declared is not None and declared.isascii() and declared.isdigit():
        if int(declared) > cap:
            raise over_limit(cap, declared)
        if large is not None and admit is not None and int(declared) > limit:
            await admit()
            admit = None
    chunks, size = [], 0
    try:
        # The ASGI messages themselves (Request.stream is an async generator around them).
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                raise PeerGoneError
            if message["type"] != "http.request":
                continue
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                if large is None or size > cap:
                    raise over_limit(cap)
                if size - len(chunk) <= limit:
                    if admit is not None:
                        await admit()
                    await large.hold()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    except BaseException:
        if large is not None:
            large.release()
        raise


async def parse_json_sized(body: bytes, limit: int) -> Any:
    """``parse_json``; a body over ``limit`` (only a session.import may be: up to 32 MiB) on
    a worker thread, so the loop keeps serving others while it is decoded."""
    if len(body) > limit:
        return await asyncio.to_thread(parse_json, body)
    return parse_json(body)


def parse_json(body: bytes) -> Any:
    if not body.strip():
        raise invalid("the request body is empty; send a JSON object", "body")
    try:
        return strict_json.loads(body)
    except strict_json.DuplicateKeyError as exc:
        raise invalid(f"the request body is ambiguous: {exc}", "body", duplicate_key=exc.key) from None
    except orjson.JSONDecodeError as exc:
        raise invalid(f"the request body is not valid JSON: {exc}", "body") from None


def _query_value(field: descriptor.FieldDescriptor, value: str) -> Any:
    if field.type == descriptor.FieldDescriptor.TYPE_BOOL:
        lowered = value.lower()
        if lowered in ("true", "1"):
            return True
        if lowered in ("false", "0"):
            return False
    # proto3 JSON takes numbers, enums, bytes and the string well-known types as strings.
    return value


def _map_entry(
    field: descriptor.FieldDescriptor, target: dict[str, Any], key: str, entry: str, value: str
) -> None:
    """One entry of a map field: ``labels.team=a`` or ``labels[team]=a``."""
    value_field = cast(descriptor.Descriptor, field.message_type).fields_by_name["value"]
    if value_field.message_type is not None:
        raise invalid(f"{key} cannot be set from the query string; send it in a body", key)
    entries = target.setdefault(field.name, {})
    if entry in entries:
        raise invalid(f"{key} is given more than once", key)
    entries[entry] = _query_value(value_field, value)


def bind_query(
    pairs: Iterable[tuple[str, str]], desc: descriptor.Descriptor, taken: Iterable[str] = ()
) -> dict[str, Any]:
    """Query parameters as JSON params: ``a.b=1`` sets a nested field, ``m.k=v`` or
    ``m[k]=v`` an entry of a map (the key may hold dots), a repeated field may be given many
    times; fields bound by the path cannot be given again."""
    data: dict[str, Any] = {}
    bound = set(taken)
    for key, value in pairs:
        if key in bound:
            raise invalid(f"{key} is given by the path; do not repeat it in the query", key)
        bracketed = _BRACKETED.fullmatch(key)
        names = (bracketed.group(1) if bracketed else key).split(".")
        where, target = desc, data
        for depth, name in enumerate(names):
            field = where.fields_by_name.get(name)
            if field is None:
                if key in CREDENTIAL_PARAMETERS:
                    raise invalid(CREDENTIAL_REFUSAL.format(key=key), key, unknown_fields=[key])
                raise invalid(f"unknown query parameter {key!r}", key, unknown_fields=[key])
            last = depth == len(names) - 1
            is_map = field.message_type is not None and field.message_type.GetOptions().map_entry
            if is_map and (bracketed is not None) == last:
                entry = bracketed.group(2) if bracketed else ".".join(names[depth + 1 :])
                _map_entry(field, target, key, entry, value)
                break
            if bracketed is not None and last:
                raise invalid(f"{key!r} does not name an entry of a map", key)
            if not last:
                if field.message_type is None or field.is_repeated or is_map:
                    raise invalid(f"{key!r} does not name a field of a message", key)
                nested = target.setdefault(name, {})
                where, target = field.message_type, nested
                continue
            if field.message_type is not None and field.message_type.full_name not in _STRING_MESSAGES:
                raise invalid(f"{key} cannot be set from the query string; send it in a body", key)
            converted = _query_value(field, value)
            if field.is_repeated:
                target.setdefault(name, []).append(converted)
            elif name in target:
                raise invalid(f"{key} is given more than once", key)
            else:
                target[name] = converted
    return data


def _set_path(data: dict[str, Any], path: str, value: str) -> None:
    names = path.split(".")
    for name in names[:-1]:
        child = data.setdefault(name, {})
        if not isinstance(child, dict):
            raise invalid(f"{path} is given by the path and, differently, by the body", path)
        data = child
    current = data.get(names[-1])
    if current is not None and current != value:
        raise invalid(f"{path} is {value!r} in the path but {current!r} in the body", path)
    data[names[-1]] = value


async def bind_rest(
    op: Operation,
    request: Request,
    variables: Mapping[str, str],
    limit: int,
    *,
    skip: frozenset[str] = frozenset(),
    large: LargeBodies | None = None,
    admit: Admit | None = None,
) -> dict[str, Any]:
    """The JSON params of a REST call, per the operation's ``google.api.http`` rule;
    query parameters named in ``skip`` are the caller's to read (``large``, ``admit``: as
    ``read_body``'s)."""
    rule = op.http
    # Most calls have no query string: no QueryParams for them.
    pairs = request.query_params.multi_items() if request.scope.get("query_string") else []
    if skip:
        pairs = [(key, value) for key, value in pairs if key not in skip]
    body = await read_body(request, limit, large, admit)
    if rule.body == "":
        if body.strip():
            raise invalid(
                f"{rule.method} {rule.path} takes its parameters from the path and query, not a body",
                "body",
            )
        data = bind_query(pairs, cast(descriptor.Descriptor, op.request_type.DESCRIPTOR), variables)
    else:
        if pairs:
            raise invalid(
                f"{rule.method} {rule.path} takes its parameters from the body, not the query",
                pairs[0][0],
                unknown_fields=[key for key, _ in pairs],
            )
        parsed = await parse_json_sized(body, limit) if body.strip() else {}
        if rule.body == "*":
            if not isinstance(parsed, dict):
                raise invalid(f"the request body must be a JSON object, not {type(parsed).__name__}", "body")
            data = parsed
        else:
            data = {rule.body: parsed}
    for path, value in variables.items():
        _set_path(data, path, value)
    return data
