"""CORS whose preflight answers are envelopes like every other answer of the gateway:
Starlette decides (origins, methods, headers), this only changes the answer's form."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.gateway.http.responses import Exchange

_BODY_HEADERS = frozenset({"content-length", "content-type"})


class EnvelopeCORSMiddleware(CORSMiddleware):
    def preflight_response(self, request_headers: Headers) -> Response:
        plain = super().preflight_response(request_headers)
        exchange = Exchange(request_id=None, acp_version=None)
        exchange.extra_headers = {
            key: value for key, value in plain.headers.items() if key.lower() not in _BODY_HEADERS
        }
        if plain.status_code < 400:
            return exchange.ok({})
        refused = bytes(plain.body).decode().removeprefix("Disallowed CORS ").split(", ")
        origin = request_headers.get("origin", "")
        return exchange.error(
            ACPError(
                ErrorCode.AUTH_FORBIDDEN,
                f"CORS preflight from origin {origin!r} refused: its {', '.join(refused)} "
                "not allowed (the server's --cors-origin names the allowed origins)",
                {"refused": refused, "origin": origin},
            )
        )
