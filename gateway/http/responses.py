"""Envelope responses: every HTTP answer of the gateway, errors included, is one.

An ``Exchange`` follows one request and remembers what is known so far (request id,
version), so an error at any stage still echoes them, with the time spent.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.responses import Response

from cleveragents.acp.contract import envelope, versions
from cleveragents.acp.contract.errors import ACPError, http_status
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
        return orjson.dumps(content, default=str, option=orjson.OPT_NON_STR_KEYS)


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


@dataclass
class Exchange:
    started: float = field(default_factory=time.perf_counter)
    request_id: str | None = None
    # Whether the caller chose the request id (X-Request-ID, Idempotency-Key, the envelope's).
    request_id_given: bool = False
    acp_version: str | None = None
    # The version the service negotiated for the call (its ``CallContext.served_version``);
    # empty until then, and the label is negotiated here once, only when it never was.
    served: str = ""
    extra_headers: dict[str, str] = field(default_factory=dict)
    # The major the request's path names (/api/v2/...): its versions label the answer.
    version_table: versions.VersionTable = versions.V1
    # The wire of the call, for metrics and logs: the envelope endpoint or a REST route.
    transport: str = "envelope"
    traceparent: str | None = None

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

    def ok(self, data: dict[str, Any]) -> Response:
        body = envelope.ok(self.served_version, self.ensure_request_id(), data, self.elapsed_ms)
        return EnvelopeResponse(body, 200, self.headers())

    def error_envelope(self, err: ACPError) -> dict[str, Any]:
        return envelope.error(self.served_version, self.ensure_request_id(), err, self.elapsed_ms)

    def error(self, err: ACPError) -> Response:
        headers = self.headers()
        if err.code == "AUTH_REQUIRED":
            headers["WWW-Authenticate"] = www_authenticate(err)
        if "allowed_methods" in err.details:
            headers["Allow"] = ", ".join(err.details["allowed_methods"])
        return EnvelopeResponse(self.error_envelope(err), http_status(err.code), headers)
