"""Envelope responses: every HTTP answer of the gateway, errors included, is one.

An ``Exchange`` follows one request and remembers what is known so far (request id,
version), so an error at any stage still echoes them, with the time spent.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.responses import Response
from starlette.types import Message, Send

from cleveragents.acp.contract import envelope, revisions, versions
from cleveragents.acp.contract.errors import ACPError, http_status, internal_error
from cleveragents.acp.gateway import common


class EnvelopeResponse(Response):
    """A JSON envelope: Starlette's Response, its headers built by an ``init_headers`` of
    our own (every answer of the gateway is one, and the generic header handling costs
    more than the JSON). The gateway's own headers never hold Content-Length or Content-Type."""

    media_type = "application/json"

    def __init__(
        self, content: Any, status_code: int = 200, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(content, status_code, headers)

    def init_headers(self, headers: Mapping[str, str] | None = None) -> None:
        raw = [
            (key.lower().encode("latin-1"), value.encode("latin-1")) for key, value in (headers or {}).items()
        ]
        raw.append((b"content-length", str(len(self.body)).encode("latin-1")))
        raw.append((b"content-type", b"application/json"))
        self.raw_headers = raw

    def render(self, content: Any) -> bytes:
        return render(content)


# RFC 6750 section 3.1: the error of a credential that was given but cannot be used.
_BEARER_ERRORS = {
    "TOKEN_EXPIRED": "invalid_token",
    "TOKEN_TOO_LONG": "invalid_token",
    "PRINCIPAL_REVOKED": "invalid_token",
    "AMBIGUOUS_CREDENTIALS": "invalid_request",
}


def www_authenticate(err: ACPError) -> str:
    """The challenge of an AUTH_REQUIRED answer: ``Bearer realm="acp"``, with the RFC 6750
    error when the caller's credential was refused for a stated reason."""
    error = _BEARER_ERRORS.get(str(err.details.get("refinement", "")))
    return 'Bearer realm="acp"' if error is None else f'Bearer realm="acp", error="{error}"'


# An answer as it goes on the wire: status, raw headers, body.
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]

_CACHE_CONTROL = (b"cache-control", b"no-store")
_CONTENT_TYPE = (b"content-type", b"application/json")


def render(content: Any) -> bytes:
    return orjson.dumps(content, default=str, option=orjson.OPT_NON_STR_KEYS)


def as_response(answer: Answer) -> EnvelopeResponse:
    """An ``Answer`` as a Starlette response (for FastAPI handlers and middleware), without
    rendering or encoding anything again."""
    status, headers, body = answer
    response = EnvelopeResponse.__new__(EnvelopeResponse)
    response.status_code = status
    response.background = None
    response.body = body
    response.raw_headers = headers
    return response


async def send_answer(send: Send, answer: Answer) -> None:
    """What ``as_response(answer)(scope, receive, send)`` sends, without the object."""
    status, headers, body = answer
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def guarded(run: Callable[[Send], Awaitable[None]], send: Send, what: str) -> None:
    """``run(send)``; whatever it raises before a response started answers an INTERNAL_ERROR
    envelope (logged with a correlation id, ``what`` naming the request); after that, it is
    the server's to handle."""
    started = False

    async def sending(message: Message) -> None:
        nonlocal started
        started = True
        await send(message)

    try:
        await run(sending)
    except Exception as exc:
        if started:
            raise
        await send_answer(send, Exchange().error_answer(internal_error(exc, what)))


class Exchange:
    """One request's state as far as it is known; slotted and built by hand, as it is made
    once per call."""

    __slots__ = (
        "acp_version",
        "extra_headers",
        "if_match",
        "if_revision",
        "request_id",
        "request_id_given",
        "served",
        "started",
        "traceparent",
        "transport",
        "version_table",
    )

    def __init__(self, request_id: str | None = None, acp_version: str | None = None) -> None:
        self.started = time.perf_counter()
        self.request_id = request_id
        # Whether the caller chose the request id (X-Request-ID, Idempotency-Key, the envelope's).
        self.request_id_given = False
        self.acp_version = acp_version
        # The version the service negotiated for the call (its ``CallContext.served_version``);
        # empty until then, and the label is negotiated here once, only when it never was.
        self.served = ""
        self.extra_headers: dict[str, str] = {}
        # The major the request's path names (/api/v2/...): its versions label the answer.
        self.version_table: versions.VersionTable = versions.V1
        # The wire of the call, for metrics and logs: the envelope endpoint or a REST route.
        self.transport = "envelope"
        self.traceparent: str | None = None
        # The caller's expected revision (the envelope's if_revision, or If-Match on a REST
        # route: ``if_match``, whose stale answer is 412 Precondition Failed).
        self.if_revision: int | None = None
        self.if_match = False

    @property
    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000

    @property
    def served_version(self) -> str:
        if not self.served:
            self.served = common.served_version(self.acp_version, self.version_table)
        return self.served

    def ensure_request_id(self) -> str:
        if self.request_id is None:
            self.request_id = envelope.new_request_id()
        return self.request_id

    def headers(self) -> dict[str, str]:
        return {
            "X-Request-ID": self.ensure_request_id(),
            "ACP-Version": self.served_version,
            "Cache-Control": "no-store",
            **self.extra_headers,
        }

    def _raw_headers(self, body: bytes, more: dict[str, str] | None = None) -> list[tuple[bytes, bytes]]:
        """``headers()`` and ``more`` as EnvelopeResponse sends them, in the same order."""
        raw = [
            (b"x-request-id", self.ensure_request_id().encode("latin-1")),
            (b"acp-version", self.served_version.encode("latin-1")),
            _CACHE_CONTROL,
        ]
        for extra in (self.extra_headers, more):
            if extra:
                raw.extend(
                    (key.lower().encode("latin-1"), value.encode("latin-1")) for key, value in extra.items()
                )
        raw.append((b"content-length", str(len(body)).encode("latin-1")))
        raw.append(_CONTENT_TYPE)
        return raw

    def ok_answer(self, data: dict[str, Any]) -> Answer:
        body = render(envelope.ok(self.served_version, self.ensure_request_id(), data, self.elapsed_ms))
        return 200, self._raw_headers(body), body

    def ok(self, data: dict[str, Any]) -> Response:
        return as_response(self.ok_answer(data))

    def error_envelope(self, err: ACPError) -> dict[str, Any]:
        return envelope.error(self.served_version, self.ensure_request_id(), err, self.elapsed_ms)

    def error_answer(self, err: ACPError) -> Answer:
        more: dict[str, str] = {}
        if err.code == "AUTH_REQUIRED":
            more["WWW-Authenticate"] = www_authenticate(err)
        if "allowed_methods" in err.details:
            more["Allow"] = ", ".join(err.details["allowed_methods"])
        body = render(self.error_envelope(err))
        status = http_status(err.code)
        if self.if_match and revisions.is_mismatch(err):
            status = revisions.PRECONDITION_FAILED
        return status, self._raw_headers(body, more), body

    def error(self, err: ACPError) -> Response:
        return as_response(self.error_answer(err))
