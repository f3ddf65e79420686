"""Envelope conformance: every HTTP answer checked against the envelope schema of the proto.

``EnvelopeChecker.hook`` is an httpx response hook; it reads each answer (not streams:
their frames are checked where they are read) and records what breaks the contract, so a
test can assert that nothing did. The schema is ``envelope_pb2.ResponseEnvelope`` parsed
with unknown fields refused, and ``data`` the operation's response message.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from google.protobuf import json_format

from cleveragents.acp.contract import catalog, versions
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import TABLE, ACPError, http_status
from cleveragents.acp.gateway.http.routing import ENVELOPE_PATH, HEALTH_PATH, OPENAPI_PATH, RouteTable
from cleveragents.acp.v1 import envelope_pb2, events_pb2

ENVELOPE_KEYS = frozenset({"acp_version", "request_id", "status", "data", "error", "timing"})
_ROUTES = RouteTable()


def operation_of(method: str, raw_path: str, body: bytes) -> Operation | None:
    """The operation an HTTP request names: by its REST route, or the envelope's ``operation``."""
    try:
        route, _ = _ROUTES.match(method, raw_path)
    except ACPError:
        return None
    if route.op is not None:
        return route.op
    if route.endpoint == "envelope":
        try:
            name = orjson.loads(body).get("operation")
        except (orjson.JSONDecodeError, AttributeError):
            return None
        return catalog.get(name) if isinstance(name, str) else None
    return None


def envelope_problems(
    body: Any, op: Operation | None, *, status: int | None = None, headers: httpx.Headers | None = None
) -> list[str]:
    """What is wrong with one response envelope (empty when it conforms)."""
    if not isinstance(body, dict):
        return [f"not a JSON object: {body!r:.200}"]
    problems = []
    if set(body) != ENVELOPE_KEYS:
        problems.append(f"keys {sorted(body)} are not {sorted(ENVELOPE_KEYS)}")
    try:
        json_format.ParseDict(body, envelope_pb2.ResponseEnvelope(), ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError, TypeError) as exc:
        problems.append(f"not a ResponseEnvelope: {exc}")
    if body.get("acp_version") not in versions.SUPPORTED:
        problems.append(f"acp_version {body.get('acp_version')!r}")
    if not isinstance(body.get("request_id"), str) or not body["request_id"]:
        problems.append("no request_id")
    timing = body.get("timing")
    if not isinstance(timing, dict) or not isinstance(timing.get("duration_ms"), int | float):
        problems.append(f"timing {timing!r}")
    elif timing["duration_ms"] < 0:
        problems.append("negative duration")
    if body.get("status") == "ok":
        if body.get("error") is not None or not isinstance(body.get("data"), dict):
            problems.append("ok without data, or with an error")
        elif op is not None:
            try:
                json_format.ParseDict(body["data"], op.response_type(), ignore_unknown_fields=False)
            except (json_format.ParseError, ValueError, TypeError) as exc:
                problems.append(f"data is not a {op.response_type.DESCRIPTOR.full_name}: {exc}")
        if status is not None and status != 200:
            problems.append(f"ok with HTTP {status}")
    elif body.get("status") == "error":
        error = body.get("error")
        if body.get("data") is not None or not isinstance(error, dict):
            problems.append("error without an error, or with data")
        elif set(error) != {"code", "message", "details"} or not isinstance(error.get("details"), dict):
            problems.append(f"error members {sorted(error)}")
        elif (
            status is not None
            and error.get("code") in TABLE
            and status != http_status(error["code"])
            and not _precondition_failed(error, status)
        ):
            problems.append(f"{error['code']} with HTTP {status}")
    else:
        problems.append(f"status {body.get('status')!r}")
    if headers is not None:
        if headers.get("x-request-id") != body.get("request_id"):
            problems.append("X-Request-ID differs from request_id")
        if headers.get("acp-version") != body.get("acp_version"):
            problems.append("ACP-Version differs from acp_version")
        error = body.get("error")
        code = error.get("code") if isinstance(error, dict) else None
        if code == "AUTH_REQUIRED" and not headers.get("www-authenticate", "").startswith("Bearer"):
            problems.append("AUTH_REQUIRED without WWW-Authenticate: Bearer")
    return problems


def _precondition_failed(error: dict[str, Any], status: int) -> bool:
    """A stale ``If-Match`` answers 412, not INVALID_STATE's 409 (docs/versions.md)."""
    details = error.get("details")
    refinement = details.get("refinement") if isinstance(details, dict) else None
    return status == 412 and error.get("code") == "INVALID_STATE" and refinement == "REVISION_MISMATCH"


def frame_problems(event: str, data: str) -> list[str]:
    """What is wrong with one SSE frame: an event, or an error envelope."""
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        return [f"frame data is not JSON: {exc}"]
    if event == "error":
        return envelope_problems(value, None)
    try:
        parsed = json_format.ParseDict(value, events_pb2.Event(), ignore_unknown_fields=False)
    except (json_format.ParseError, ValueError, TypeError) as exc:
        return [f"frame data is not an Event: {exc}"]
    return [] if parsed.type == event else [f"event: {event} but type {parsed.type}"]


@dataclass
class EnvelopeChecker:
    """Collects the problems of every HTTP answer it sees."""

    checked: int = 0
    problems: list[str] = field(default_factory=list)

    def check(self, method: str, raw_target: str, request_body: bytes, response: httpx.Response) -> None:
        self.checked += 1
        where = f"{method} {raw_target} -> {response.status_code}"
        raw_path = raw_target.split("?")[0]
        if raw_path == OPENAPI_PATH:
            return
        content_type = response.headers.get("content-type", "")
        if content_type.startswith("text/event-stream"):
            if response.status_code != 200 or not response.headers.get("x-request-id"):
                self.problems.append(f"{where}: stream without 200 and X-Request-ID")
            return
        if content_type != "application/json":
            self.problems.append(f"{where}: content-type {content_type!r}")
            return
        try:
            body = orjson.loads(response.content)
        except orjson.JSONDecodeError as exc:
            self.problems.append(f"{where}: not JSON: {exc}")
            return
        op = operation_of(method, raw_path, request_body)
        sent = _json(request_body).get("request_id") or response.request.headers.get("x-request-id")
        if sent and isinstance(body, dict) and body.get("request_id") != sent:
            self.problems.append(f"{where}: request id {sent!r} came back as {body.get('request_id')!r}")
        if (
            raw_path == HEALTH_PATH
            and body.get("status") == "ok"
            and body.get("data") != {"status": "SERVING"}
        ):
            self.problems.append(f"{where}: health data {body.get('data')!r}")
        found = envelope_problems(body, op, status=response.status_code, headers=response.headers)
        self.problems.extend(f"{where}: {problem}" for problem in found)

    async def hook(self, response: httpx.Response) -> None:
        if response.headers.get("content-type", "").startswith("text/event-stream"):
            self.check(response.request.method, _raw(response.request), b"", response)
            return
        await response.aread()
        self.check(response.request.method, _raw(response.request), _body(response.request), response)


def _json(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _raw(request: httpx.Request) -> str:
    return request.url.raw_path.decode("ascii")


def _body(request: httpx.Request) -> bytes:
    try:
        return request.content
    except httpx.RequestNotRead:
        return b""


__all__ = ["ENVELOPE_PATH", "EnvelopeChecker", "envelope_problems", "frame_problems", "operation_of"]
