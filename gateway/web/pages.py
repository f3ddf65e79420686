"""The routes of the console and the API docs page on the gateway's FastAPI application."""

from __future__ import annotations

import pathlib

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import FileResponse
from starlette.staticfiles import StaticFiles

from cleveragents.acp.gateway.web import security

STATIC = pathlib.Path(__file__).parent / "static"
CONSOLE = STATIC / "console"
DOCS = STATIC / "docs"
CONSOLE_ASSETS = "/console"
DOCS_PATH = "/api/v1/docs"
DOCS_ASSETS = DOCS_PATH + "/assets"


def install(app: FastAPI) -> None:
    """``/`` and ``/console/...``: the console; ``/api/v1/docs``: Swagger UI over the
    application's OpenAPI document, its assets from the ``fastapi-offline`` package (which
    ships Swagger UI's files, so no CDN is needed)."""
    console_headers = security.headers(security.CONSOLE_CSP)
    docs_headers = security.headers(security.DOCS_CSP)

    async def console(request: Request) -> FileResponse:
        return FileResponse(CONSOLE / "index.html", headers=console_headers)

    async def docs(request: Request) -> FileResponse:
        return FileResponse(DOCS / "index.html", headers=docs_headers)

    app.add_route("/", console, methods=["GET"], include_in_schema=False)
    app.add_route(DOCS_PATH, docs, methods=["GET"], include_in_schema=False)
    app.mount(
        CONSOLE_ASSETS,
        security.SecurityHeaders(StaticFiles(directory=CONSOLE), console_headers),
        name="console",
    )
    app.mount(
        DOCS_ASSETS,
        security.SecurityHeaders(
            StaticFiles(directory=DOCS, packages=[("fastapi_offline", "static")]), docs_headers
        ),
        name="docs-assets",
    )
