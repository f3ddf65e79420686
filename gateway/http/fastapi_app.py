"""``GatewayApp``: the gateway as a FastAPI application users can extend (``build_app``
makes one over a ``Service``), around the raw endpoint of ``endpoint.Gateway``.

Mount it in another application, add routes, middleware, dependencies and exception
handlers as to any FastAPI app. What it serves itself:

- the hot paths (the envelope, every REST route of the catalog, SSE, health) as one raw
  ASGI endpoint that a request for a path of the gateway's route table reaches directly,
  past FastAPI's router, exception and exit-stack layers (user middleware still wraps it);
- ``/api/v1/openapi.json``: the document derived from the descriptors, plus the routes
  users added; ``/api/v1/docs``: Swagger UI over it; ``/``: the web console.

Any path neither serves reaches FastAPI's router as usual. Whatever is raised before a
response started answers an error envelope; so do unknown paths.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI
from fastapi.exception_handlers import http_exception_handler
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from cleveragents.acp.contract import versions
from cleveragents.acp.contract.errors import ACPError, ErrorCode, internal_error
from cleveragents.acp.contract.transport import Service
from cleveragents.acp.gateway import common
from cleveragents.acp.gateway.http import openapi, redaction
from cleveragents.acp.gateway.http.cors import EnvelopeCORSMiddleware
from cleveragents.acp.gateway.http.endpoint import REPLAYED, Gateway, GatewaySettings
from cleveragents.acp.gateway.http.responses import guarded
from cleveragents.acp.gateway.http.routing import OPENAPI_PATH, not_found, route_path
from cleveragents.acp.gateway.web import pages

# What CORS allows a browser to send to the gateway.
ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


class GatewayApp(FastAPI):
    def __init__(self, gateway: Gateway, **options: Any) -> None:
        """``options`` go to FastAPI (``dependencies``, ``root_path``, ``lifespan``, ...)."""
        super().__init__(
            **{
                "title": "CleverAgents ACP",
                "version": versions.CURRENT,
                "openapi_url": OPENAPI_PATH,
                "docs_url": None,
                "redoc_url": None,
                "swagger_ui_oauth2_redirect_url": None,
                **options,
            }
        )
        self.gateway = gateway
        self.state.gateway = gateway
        # Set when the middleware stack is built: no user middleware to run on the hot paths.
        self._direct = False
        self.add_exception_handler(StarletteHTTPException, self._http_error)
        self.add_exception_handler(ACPError, self._acp_error)
        self.add_exception_handler(Exception, self._fault)
        pages.install(self)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A hot path skips FastAPI's per-request telemetry check (it reads the environment
        several times per request, a seventh of a call's CPU, even with telemetry off):
        FastAPI's OpenTelemetry instrumentation covers the other paths only."""
        if scope["type"] == "http":
            if self.root_path:
                scope["root_path"] = self.root_path
            try:
                found: object = self.gateway.routes.find(scope["method"], route_path(scope))
            except ACPError:
                found = WRONG_METHOD
            if found is not None:
                scope["app"] = self
                if self.middleware_stack is None:
                    self.middleware_stack = self.build_middleware_stack()
                if self._direct:
                    # No user middleware: straight to the gateway, which guards itself.
                    route = None if found is WRONG_METHOD else found
                    await self.gateway.serve(route, scope, receive, send)  # type: ignore[arg-type]
                    return
                scope[HOT_ROUTE] = found
                await self.middleware_stack(scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    def build_middleware_stack(self) -> ASGIApp:
        """User middleware around the hot paths and FastAPI's own stack alike; the guard
        outermost."""
        added = self.user_middleware
        self._direct = not added
        self.user_middleware = []
        try:
            framework = super().build_middleware_stack()
        finally:
            self.user_middleware = added
        app: ASGIApp = HotPaths(self.gateway, framework)
        for cls, args, kwargs in reversed(added):
            app = cls(app, *args, **kwargs)
        return EnvelopeGuard(self.gateway, app)

    def openapi(self) -> dict[str, Any]:
        """The descriptors' document, with the routes users added (built once, as FastAPI does)."""
        if self.openapi_schema is None:
            document = openapi.document(self.gateway.settings.server_build, self.gateway.contract)
            added = [r for r in self.routes if isinstance(r, APIRoute) and r.include_in_schema]
            if added:
                extra = get_openapi(title=self.title, version=self.version, routes=added)
                for path, item in extra.get("paths", {}).items():
                    document["paths"].setdefault(path, {}).update(item)
                schemas = extra.get("components", {}).get("schemas", {})
                document["components"]["schemas"].update(schemas)
            self.openapi_schema = document
        return self.openapi_schema

    async def _http_error(self, request: Request, exc: Exception) -> Response:
        """A user's route keeps FastAPI's answer; anything else (no route matched, a
        static file missing) answers an envelope."""
        assert isinstance(exc, StarletteHTTPException)
        if isinstance(request.scope.get("route"), APIRoute):
            return await http_exception_handler(request, exc)
        if exc.status_code in (404, 405):
            return self.gateway.refuse(not_found(request.url.path))
        return self.gateway.refuse(ACPError(ErrorCode.INVALID_PARAMS, str(exc.detail)))

    async def _acp_error(self, request: Request, exc: Exception) -> Response:
        """An ACP call a user's route made failed: its envelope, with its status."""
        assert isinstance(exc, ACPError)
        return self.gateway.refuse(exc)

    async def _fault(self, request: Request, exc: Exception) -> Response:
        return self.gateway.refuse(internal_error(exc, f"{request.method} {request.url.path}"))


# The scope key of a hot path's route, found once by ``GatewayApp``.
HOT_ROUTE = "cleveragents.acp.route"
WRONG_METHOD = object()


class HotPaths:
    """A request for a path of the gateway's route table (``GatewayApp`` found its route)
    goes straight to the gateway endpoint; any other request to ``framework``."""

    def __init__(self, gateway: Gateway, framework: ASGIApp) -> None:
        self.gateway = gateway
        self.framework = framework

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = scope.get(HOT_ROUTE)
        if found is None:
            if scope["type"] == "http":
                # Two Authorization headers are refused here as on the hot paths, so a user's
                # route or a console page never sees one of them picked.
                count = sum(1 for key, _ in scope["headers"] if key == b"authorization")
                if count > 1:
                    await self.gateway.refuse(common.authorizations(count))(scope, receive, send)
                    return
            await self.framework(scope, receive, send)
        elif found is WRONG_METHOD:
            # A gateway path, another method: the gateway names the allowed ones.
            await self.gateway(scope, receive, send)
        else:
            await self.gateway.serve(found, scope, receive, send)


class EnvelopeGuard:
    """Anything raised before a response started answers an INTERNAL_ERROR envelope
    (logged with a correlation id); after that, it is the server's to handle."""

    def __init__(self, gateway: Gateway, app: ASGIApp) -> None:
        self.gateway = gateway
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await guarded(
            lambda sending: self.app(scope, receive, sending), send, f"{scope['method']} {scope['path']}"
        )


def build_app(
    service: Service,
    settings: GatewaySettings | None = None,
    *,
    closing: asyncio.Event | None = None,
) -> GatewayApp:
    """The gateway as a FastAPI application: mount it, add routes, middleware and
    dependencies as to any other (docs/server.md, "Extending the gateway")."""
    settings = settings or GatewaySettings()
    redaction.install()
    app = GatewayApp(Gateway(service, settings, closing=closing))
    if settings.cors_origins:
        app.add_middleware(
            EnvelopeCORSMiddleware,
            allow_origins=list(settings.cors_origins),
            allow_methods=ALL_METHODS,
            allow_headers=[
                "Authorization",
                "Content-Type",
                "ACP-Version",
                "X-Request-ID",
                "Idempotency-Key",
                "Last-Event-ID",
            ],
            expose_headers=["X-Request-ID", "ACP-Version", "WWW-Authenticate", REPLAYED],
            max_age=600,
        )
    return app


__all__ = ["EnvelopeGuard", "GatewayApp", "GatewaySettings", "HotPaths", "build_app"]
