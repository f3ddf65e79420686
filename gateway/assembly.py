"""The server assembled: what ``agents serve`` and ``agents gateway`` run.

The CLI parses its flags and hands them here; this reads the settings (flags over the
environment over the config file, ``gateway.settings``), opens the facade and its store,
starts ``gateway.server.Server`` and prints the addresses, then one machine-readable line,
``acp-ready {"http": ..., "grpc": ...}``, which scripts and tests wait for (ports given as
0 are chosen by the system and reported there). The gateway-only mode's upstream transport
comes from the caller (``connect``): the gateway never imports a client. What the server of
``agents serve`` shares with its workers (``--workers N``, ``gateway.workers``) before and
after it listens is ``gateway.startup``.
"""

from __future__ import annotations

import gc
import pathlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

from cleveragents.acp.contract.transport import Transport
from cleveragents.acp.facade import auth
from cleveragents.acp.gateway import loops, workers
from cleveragents.acp.gateway.server import ServeError, Server, ServerConfig, check_exposure
from cleveragents.acp.gateway.settings import GatewayCommandSettings
from cleveragents.acp.gateway.startup import (
    Prepared,
    banner,
    command_settings,
    fail,
    first_token,
    prepare,
    ready_line,
    server_config,
)
from cleveragents.acp.gateway.upstream import unreachable

# (target, tls, root certificates) -> a transport to the upstream gRPC server.
Connect = Callable[[str, bool, bytes | None], Transport]


def serve(flags: Mapping[str, Any], config: pathlib.Path | None) -> int:
    """``agents serve``: gRPC and the HTTP gateway over one facade; the exit code. With
    ``--workers N`` above 1, a parent process supervising N of them (``gateway.workers``)."""
    prepared = prepare(flags, config)
    if isinstance(prepared, int):
        return prepared
    if prepared.settings.workers > 1:
        return workers.supervise(prepared, flags, config)
    # Everything imported and built so far (modules, descriptors, the catalog) lives as long
    # as the server: moved out of the collector's reach, the full collections it runs under
    # load no longer walk it. They had made the envelope's p99 63 ms at p50 5 ms
    # (gateway_envelope_p99_ratio 12, 2.1 with the freeze; docs/benchmarks.md).
    gc.freeze()
    return loops.run(_serve(prepared), loops.resolve(prepared.settings.loop))


async def _serve(prepared: Prepared) -> int:
    # The server listens (and /readyz says ``migrating``) while the store opens off the loop.
    server = Server(prepared.config, opening=prepared.opening(None))
    try:
        addresses = await server.start()
    except ServeError as exc:
        return fail("serve", str(exc))
    facade = server.facade
    assert facade is not None
    server.install_signal_handlers()
    try:
        token = first_token(prepared)
        if token is not None and isinstance(facade.authenticator, auth.TokenAuthenticator):
            facade.authenticator.reload()
        print(banner(prepared, addresses, token, facade.served_operations), flush=True)
        print(ready_line(addresses.http_url, addresses.grpc_target), flush=True)
        await server.wait()
    finally:
        await server.stop()
    return 0


def gateway(flags: Mapping[str, Any], config: pathlib.Path | None, connect: Connect) -> int:
    """``agents gateway``: the HTTP gateway alone, in front of the upstream ``connect``
    reaches; the exit code."""
    try:
        settings = command_settings(flags, config, GatewayCommandSettings)
        server = server_config(settings, None)
        host = settings.upstream.rsplit(":", 1)[0]
        tls = settings.upstream_tls or settings.upstream_ca is not None
        check_exposure(host, True if tls else None, settings.insecure, "reach the upstream over")
        root = settings.upstream_ca.read_bytes() if settings.upstream_ca is not None else None
    except (ValueError, ServeError, OSError) as exc:
        return fail("gateway", str(exc))
    try:
        loop = loops.resolve(settings.loop)
    except loops.LoopUnavailableError as exc:
        return fail("gateway", str(exc))
    return loops.run(_gateway(server, settings.upstream, connect, tls, root), loop)


async def _gateway(
    config: ServerConfig, upstream: str, connect: Connect, tls: bool, root: bytes | None
) -> int:
    # Inside the loop: a grpc.aio channel belongs to the loop it is made in.
    transport = connect(upstream, tls, root)
    server = Server(config, upstream=transport)
    try:
        addresses = await server.start()
    except ServeError as exc:
        return fail("gateway", str(exc))
    server.install_signal_handlers()
    try:
        problem = await unreachable(transport)
        print(
            f"ACP gateway listening on the {loops.running()} event loop\n"
            f"  HTTP    {addresses.http_url}   (agents --server {addresses.http_url})\n"
            f"  console {addresses.http_url}/\n  upstream {upstream}"
            + ("   (NOT REACHABLE now)" if problem else ""),
            flush=True,
        )
        if problem:
            print(
                f"agents gateway: warning: the upstream {upstream} cannot be reached ({problem}); "
                "every call answers INTERNAL_ERROR (grpc_code UNAVAILABLE, retryable) until it can",
                file=sys.stderr,
                flush=True,
            )
        print(ready_line(addresses.http_url, None), flush=True)
        await server.wait()
    finally:
        await server.stop()
    return 0
