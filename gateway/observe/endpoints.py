"""``/metrics`` (Prometheus text) and ``/readyz`` (ready to take calls), beside ``/healthz``
(process alive, one of the gateway's hot paths).

Who may scrape: on the gateway's own port, clients on a loopback address only (metrics name
operations and counts, not secrets, but they are the operator's); ``--metrics-port`` serves
them on a listener of their own, to whoever the operator lets reach it.
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Awaitable, Callable

from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.gateway.http.responses import Exchange
from cleveragents.acp.gateway.observe.metrics import CONTENT_TYPE, Metrics

METRICS_PATH = "/metrics"
READY_PATH = "/readyz"
PROBE_SECONDS = 2.0
STARTING, MIGRATING, READY, DRAINING = "starting", "migrating", "ready", "draining"


class Readiness:
    """Ready once started, until the server begins to drain; and only while the store answers."""

    def __init__(self, probe: Callable[[], Awaitable[object]] | None = None) -> None:
        self.state = STARTING
        self._probe = probe
        self.changed: list[Callable[[bool], Awaitable[None]]] = []

    def probe_with(self, probe: Callable[[], Awaitable[object]]) -> None:
        self._probe = probe

    async def _set(self, state: str) -> None:
        self.state = state
        for listener in self.changed:
            await listener(state == READY)

    async def migrating(self) -> None:
        """The store is being opened and migrated: not ready, and saying why."""
        await self._set(MIGRATING)

    async def ready(self) -> None:
        await self._set(READY)

    async def drain(self) -> None:
        await self._set(DRAINING)

    async def check(self) -> tuple[bool, str]:
        if self.state != READY:
            return False, self.state
        if self._probe is not None:
            try:
                await asyncio.wait_for(self._probe(), PROBE_SECONDS)
            except ACPError as err:
                # A full disk: the store answers reads, but no write can succeed.
                if err.details.get("refinement") == "STORE_DISK_FULL":
                    return False, "store_disk_full"
                return False, "store_unreachable"
            except Exception:
                return False, "store_unreachable"
        return True, READY


def _is_loopback(request: Request) -> bool:
    client = request.client
    if client is None:
        return False
    try:
        return ipaddress.ip_address(client.host).is_loopback
    except ValueError:
        return False


async def render(metrics: Metrics) -> Response:
    await metrics.sample()
    body = await asyncio.to_thread(metrics.render)
    return Response(body, media_type=CONTENT_TYPE, headers={"Cache-Control": "no-store"})


def install(app: FastAPI, metrics: Metrics, readiness: Readiness, *, loopback_only: bool = True) -> None:
    async def scrape(request: Request) -> Response:
        if loopback_only and not _is_loopback(request):
            return Exchange().error(
                ACPError(
                    ErrorCode.AUTH_FORBIDDEN,
                    "metrics are served to loopback clients on this port; "
                    "give the server --metrics-port to serve them on a port of their own",
                    {"path": METRICS_PATH},
                )
            )
        return await render(metrics)

    async def ready(request: Request) -> Response:
        is_ready, state = await readiness.check()
        exchange = Exchange()
        if is_ready:
            return exchange.ok({"status": state})
        response = exchange.error(
            ACPError(
                ErrorCode.INVALID_STATE, f"not ready: {state}", {"status": state}, refinement="NOT_READY"
            )
        )
        response.status_code = 503
        return response

    app.add_api_route(METRICS_PATH, scrape, methods=["GET"], include_in_schema=False)
    app.add_api_route(READY_PATH, ready, methods=["GET"], include_in_schema=False)


def metrics_app(metrics: Metrics) -> FastAPI:
    """The ``--metrics-port`` listener's application: ``/metrics`` and nothing else."""
    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)

    async def scrape() -> Response:
        return await render(metrics)

    app.add_api_route(METRICS_PATH, scrape, methods=["GET"])
    return app
