"""Response headers of every page and asset the gateway serves to browsers.

The policy admits scripts and styles from the server itself only: no inline script or
style, no ``eval``, no other origin, no framing. The console also requires Trusted Types,
so assigning a string to ``innerHTML`` (or any other HTML sink) throws: what a user or a
model wrote can only ever reach the page as text.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

_BASE = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "font-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
CONSOLE_CSP = _BASE + "; require-trusted-types-for 'script'; trusted-types 'none'"
# Swagger UI renders descriptions as HTML (sanitized by DOMPurify), so no Trusted Types.
DOCS_CSP = _BASE

_COMMON = {
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cross-origin-opener-policy": "same-origin",
    "cache-control": "no-cache",
}


def headers(csp: str) -> dict[str, str]:
    return {"content-security-policy": csp, **_COMMON}


class SecurityHeaders:
    """Pure ASGI: sets ``headers`` on every response of ``app`` (replacing its own)."""

    def __init__(self, app: ASGIApp, extra: Mapping[str, str]) -> None:
        self.app = app
        self.extra = [(key.encode(), value.encode()) for key, value in extra.items()]
        self.names = {key for key, _ in self.extra}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in self.names]
                message = {**message, "headers": kept + self.extra}
            await send(message)

        await self.app(scope, receive, sending)
