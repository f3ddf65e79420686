"""Server mode: one process, one event loop, a grpc.aio server and uvicorn sharing one facade,
both entering it through the same seam (``ServiceFacade.invoke`` and ``stream``).

Also the gateway-only mode: uvicorn alone, its service an upstream server reached over a
client ``Transport`` (``upstream.TransportService``).

Start-up refuses a port already in use (gRPC's SO_REUSEPORT is off, the HTTP socket is
bound here) and plain text on a non-loopback address unless ``insecure``. SIGTERM/SIGINT
stop it gracefully: streams end cleanly, in-flight calls finish within the grace period,
then the facade (and its store) is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import math
import pathlib
import signal
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import grpc
import uvicorn
from grpc_health.v1._async import HealthServicer

from cleveragents.acp.contract.transport import Service, Transport
from cleveragents.acp.facade.service_facade import Closeable, ServiceFacade
from cleveragents.acp.gateway.grpc import server as grpc_server
from cleveragents.acp.gateway.grpc.connections import ConnectionGuard
from cleveragents.acp.gateway.http import protocol
from cleveragents.acp.gateway.http.endpoint import GatewaySettings
from cleveragents.acp.gateway.http.fastapi_app import GatewayApp, build_app
from cleveragents.acp.gateway.http.protocol import ConnectionLimits
from cleveragents.acp.gateway.observe import endpoints, setup
from cleveragents.acp.gateway.observe.setup import Observability
from cleveragents.acp.gateway.observe.upstream import ObservedTransport
from cleveragents.acp.gateway.opening import OpeningService
from cleveragents.acp.gateway.upstream import TransportService

log = logging.getLogger(__name__)

# After the grace period the facade cuts the calls still running (each answered with whether
# it took effect); uvicorn and gRPC cancel what is left this much later, a backstop that
# leaves the cut calls time to settle their writes and send their answers.
CUT_MARGIN_SECONDS = 5.0


class ServeError(Exception):
    """The server cannot start as configured (port in use, bad TLS files, exposure rule)."""


@dataclass(frozen=True)
class TLSFiles:
    cert: pathlib.Path
    key: pathlib.Path


@dataclass(frozen=True)
class ServerConfig:
    host: str = "127.0.0.1"
    http_port: int = 8080
    # None: no gRPC server (gateway-only mode).
    grpc_port: int | None = 50051
    tls: TLSFiles | None = None
    insecure: bool = False
    http: GatewaySettings = field(default_factory=GatewaySettings)
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)
    grace_seconds: float = 10.0
    log_level: str = "warning"
    # The server owns the process's logging (a command does; an embedder or a test keeps its own).
    manage_logging: bool = False
    log_format: str = "auto"
    access_log: bool = True
    # None: /metrics on the HTTP port for loopback clients only.
    metrics_port: int | None = None
    # A worker of ``agents serve --workers``: share the HTTP and gRPC ports with the other
    # workers (SO_REUSEPORT on these listeners only; the parent checked the ports are free).
    reuse_port: bool = False


@dataclass(frozen=True)
class Addresses:
    http_url: str
    grpc_target: str | None


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def check_exposure(host: str, tls: object | None, insecure: bool, what: str = "serve") -> None:
    """Plain text only on loopback, unless the operator says ``--insecure``."""
    if tls is None and not insecure and not is_loopback(host):
        raise ServeError(
            f"refusing to {what} plain HTTP/gRPC on {host}, which is not a loopback address: "
            "give --tls-cert and --tls-key, or --insecure to accept the risk"
        )


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def bind_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except OSError as exc:
        raise ServeError(f"cannot resolve {host}: {exc}") from None
    sock = socket.socket(family, kind, proto)
    try:
        # Reuse a port in TIME_WAIT; Linux still refuses a port another socket listens on.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise ServeError(f"cannot listen for HTTP on {_url_host(host)}:{port}: {exc.strerror}") from None
    sock.setblocking(False)
    return sock


class _Uvicorn(uvicorn.Server):
    """uvicorn without its own signal handling: the server's loop handlers stop both halves."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Server:
    def __init__(
        self,
        config: ServerConfig,
        *,
        facade: ServiceFacade | None = None,
        opening: Callable[[], ServiceFacade] | None = None,
        upstream: Transport | None = None,
        resources: Sequence[Closeable] = (),
        observability: Observability | None = None,
    ) -> None:
        """Serves ``facade`` over HTTP and gRPC, closing it at the end after ``resources``;
        or, gateway-only, HTTP in front of ``upstream`` (a transport to another server). Calls
        are observed in the facade, or, gateway-only, as they go upstream."""
        if facade is None and opening is None and config.grpc_port is not None:
            raise ServeError("a gRPC port needs a facade to serve")
        self.observability = observability or setup.build(
            log_level=config.log_level,
            log_format=config.log_format,
            access_log=config.access_log,
            metrics_port=config.metrics_port,
            manage_logging=config.manage_logging,
        )
        self.service: Service
        # ``opening``: the facade is opened (migrated) by ``start``, once the server listens.
        self._opening = opening
        self._stand_in: OpeningService | None = None
        if facade is not None and upstream is None and opening is None:
            self.service = facade
            self._attach(facade)
        elif opening is not None and upstream is None and facade is None:
            self.service = self._stand_in = OpeningService()
        elif upstream is not None and facade is None and opening is None:
            self.service = TransportService(ObservedTransport(upstream, self.observability.telemetry))
        else:
            raise ServeError("serve a facade or an upstream, one of them")
        self.config = config
        self.upstream = upstream
        self.facade = facade
        self.resources = list(resources)
        self.closing = asyncio.Event()
        self._stop = asyncio.Event()
        self._grpc: grpc.aio.Server | None = None
        self._health: HealthServicer | None = None
        self._uvicorn: _Uvicorn | None = None
        self._uvicorn_task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None
        self._metrics_server: _Uvicorn | None = None
        self._metrics_task: asyncio.Task[None] | None = None
        # The gRPC port's connection sweep (gateway/grpc/connections.py).
        self._guard_task: asyncio.Task[None] | None = None
        self.app: GatewayApp | None = None
        self.metrics_url: str | None = None
        self.addresses: Addresses | None = None

    def _attach(self, facade: ServiceFacade) -> None:
        """Observe the facade's calls, and read readiness and gauges from its store."""
        facade.observer = self.observability.telemetry
        with contextlib.suppress(RuntimeError):
            # On the serving loop (the takeover scanner belongs to it); none yet: at start.
            asyncio.get_running_loop()
            facade.start()
        if facade.inspector is not None:
            self.observability.readiness.probe_with(facade.inspector.probe)
            self.observability.metrics.sample_with(facade.inspector.census)
            facade.inspector.observe_store(self.observability.metrics)
            self.observability.metrics.count_cached_reads_with(facade.inspector.read_cache_counts)

    async def _open(self, opening: Callable[[], ServiceFacade], stand_in: OpeningService) -> None:
        """Open the facade on a worker thread (migrations, restart recovery) while the
        server already answers: not ready (``migrating``) until it is open."""
        await self.observability.readiness.migrating()
        facade = await asyncio.to_thread(opening)
        self._attach(facade)
        self.facade = facade
        stand_in.serve(facade)

    def _grpc_credentials(self) -> grpc.ServerCredentials | None:
        tls = self.config.tls
        if tls is None:
            return None
        return grpc.ssl_server_credentials([(tls.key.read_bytes(), tls.cert.read_bytes())])

    async def start(self) -> Addresses:
        config = self.config
        if self.facade is not None:
            self.facade.start()
        tls = config.tls
        check_exposure(config.host, tls, config.insecure)
        if tls is not None:
            for path in (tls.cert, tls.key):
                if not path.is_file():
                    raise ServeError(f"TLS file {path} does not exist")
        observability = self.observability
        if observability.logging is not None:
            observability.logging.start()
        if self._opening is not None:
            # Not ready, and saying why, from the first request the socket can take.
            await observability.readiness.migrating()
        self._socket = bind_socket(config.host, config.http_port, reuse_port=config.reuse_port)
        try:
            grpc_target = await self._start_grpc()
            app = self.app = build_app(self.service, config.http, closing=self.closing)
            endpoints.install(app, observability.metrics, observability.readiness)
            uv_config = uvicorn.Config(
                app,
                lifespan="off",
                log_level=config.log_level,
                access_log=False,
                server_header=False,
                # Our HTTP/1.1 protocol (uvicorn's httptools one, guarded): envelopes for refusals,
                # header/body timeouts, caps.
                http=protocol.protocol_factory(config.connections),  # type: ignore[arg-type]
                # No WebSocket routes: an Upgrade request is served as plain HTTP, so every
                # connection stays under the guards (uvicorn would hand it to a protocol of its
                # own when a WebSocket library happens to be installed).
                ws="none",
                timeout_keep_alive=config.connections.idle_timeout,
                timeout_graceful_shutdown=math.ceil(config.grace_seconds + CUT_MARGIN_SECONDS),
                ssl_certfile=str(tls.cert) if tls else None,
                ssl_keyfile=str(tls.key) if tls else None,
            )
            try:
                uv_config.load()
            except (OSError, ValueError) as exc:
                raise ServeError(f"cannot load the TLS certificate and key: {exc}") from None
            self._uvicorn = _Uvicorn(uv_config)
            self._uvicorn_task = asyncio.create_task(self._uvicorn.serve(sockets=[self._socket]))
            while not self._uvicorn.started:
                if self._uvicorn_task.done():
                    raise ServeError("the HTTP server stopped during start-up")
                await asyncio.sleep(0.01)
            await self._start_metrics()
            if self._opening is not None and self._stand_in is not None:
                await self._open(self._opening, self._stand_in)
        except BaseException:
            await self._abandon()
            raise
        port = self._socket.getsockname()[1]
        scheme = "https" if tls else "http"
        self.addresses = Addresses(f"{scheme}://{_url_host(config.host)}:{port}", grpc_target)
        await observability.readiness.ready()
        return self.addresses

    async def _start_metrics(self) -> None:
        """``--metrics-port``: /metrics on a listener of its own (plain HTTP, like any scrape
        target: put it where only the monitoring network reaches)."""
        port = self.observability.metrics_port
        if port is None:
            return
        sock = bind_socket(self.config.host, port)
        config = uvicorn.Config(
            endpoints.metrics_app(self.observability.metrics),
            lifespan="off",
            log_level=self.config.log_level,
            access_log=False,
            server_header=False,
        )
        self._metrics_server = _Uvicorn(config)
        self._metrics_task = asyncio.create_task(self._metrics_server.serve(sockets=[sock]))
        while not self._metrics_server.started:
            if self._metrics_task.done():
                raise ServeError("the metrics listener stopped during start-up")
            await asyncio.sleep(0.01)
        self.metrics_url = (
            f"http://{_url_host(self.config.host)}:{sock.getsockname()[1]}{endpoints.METRICS_PATH}"
        )

    async def _start_grpc(self) -> str | None:
        if self.config.grpc_port is None or (self.facade is None and self._stand_in is None):
            return None
        guard = ConnectionGuard(self.config.connections)
        self._grpc, self._health = grpc_server.build_server(
            self.service,
            closing=self.closing,
            max_message_bytes=self.config.http.max_body_bytes,
            reuse_port=self.config.reuse_port,
            guard=guard,
        )
        address = f"{_url_host(self.config.host)}:{self.config.grpc_port}"
        try:
            port = grpc_server.bind(
                self._grpc, address, self._grpc_credentials(), probe=not self.config.reuse_port
            )
        except OSError as exc:
            raise ServeError(str(exc)) from None
        await self._grpc.start()
        guard.port = port
        self._guard_task = asyncio.create_task(guard.run())
        health = self._health
        self.observability.readiness.changed.append(lambda ready: grpc_server.mark_serving(health, ready))
        return f"{_url_host(self.config.host)}:{port}"

    async def _abandon(self) -> None:
        await self._stop_metrics()
        if self._grpc is not None:
            await self._grpc.stop(None)
        if self._socket is not None:
            self._socket.close()
        await self._close_backend()

    def request_stop(self) -> None:
        self._stop.set()

    def install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._on_signal)

    def _on_signal(self) -> None:
        if self._stop.is_set() and self._uvicorn is not None:
            self._uvicorn.force_exit = True
        self.request_stop()

    async def wait(self) -> None:
        """Until a stop is requested, or the HTTP server ends by itself."""
        if self._uvicorn_task is None:
            raise RuntimeError("the server is not started")
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({stop, self._uvicorn_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()

    async def stop(self) -> None:
        """Not ready first (load balancers and gRPC health see it); both wires stop taking
        calls at once; streams end and in-flight calls finish within the grace period; the
        facade then cuts what still runs, each call answered with whether it took effect
        (contract/stopping.py); then the store closes."""
        self.observability.telemetry.draining = True
        await self.observability.readiness.drain()
        self.closing.set()
        grace = self.config.grace_seconds
        grpc_stopped = None
        if self._grpc is not None:
            grpc_stopped = asyncio.ensure_future(self._grpc.stop(grace + CUT_MARGIN_SECONDS))
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True
            # uvicorn notices ``should_exit`` at its next tick (0.1 s); its listeners close now.
            for listener in self._uvicorn.servers:
                listener.close()
        cut = asyncio.get_running_loop().call_later(grace, self._cut)
        try:
            if self._health is not None:
                await self._health.enter_graceful_shutdown()
            if self._uvicorn_task is not None:
                with contextlib.suppress(Exception):
                    await self._uvicorn_task
            if grpc_stopped is not None:
                await grpc_stopped
        finally:
            cut.cancel()
        await self._close_backend()

    def _cut(self) -> None:
        if self.facade is not None:
            cut = self.facade.cut()
            if cut:
                log.warning("grace period over: %d call(s) still running were cut", cut)

    async def _close_backend(self) -> None:
        if self._guard_task is not None:
            self._guard_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._guard_task
            self._guard_task = None
        try:
            for resource in reversed(self.resources):
                await resource.close()
            if self.upstream is not None:
                await self.upstream.close()
            if self.facade is not None:
                await self.facade.close()
        finally:
            await self._stop_metrics()
            if self.observability.logging is not None:
                self.observability.logging.stop()

    async def _stop_metrics(self) -> None:
        if self._metrics_server is not None and self._metrics_task is not None:
            self._metrics_server.should_exit = True
            with contextlib.suppress(Exception):
                await self._metrics_task
            self._metrics_server = None
