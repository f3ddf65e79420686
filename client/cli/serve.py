"""``agents serve`` (gRPC and the HTTP gateway over one facade) and ``agents gateway``
(the HTTP gateway alone, in front of an upstream gRPC server).

Once listening, both print the addresses and then one machine-readable line,
``acp-ready {"http": ..., "grpc": ...}``, which scripts and tests wait for (ports given as
0 are chosen by the system and reported there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import pathlib
import shlex
import sys
from typing import Any

DEV_PRINCIPAL = "dev"
DEV_NAMESPACE = "default"


def _common_options(parser: argparse.ArgumentParser) -> None:
    """Every option also comes from ``ACP_<NAME>`` and from the ``--config`` file; the
    values are checked once, by ``gateway.settings`` (flags > environment > file)."""
    parser.add_argument(
        "--config",
        type=pathlib.Path,
        default=None,
        metavar="FILE",
        help="TOML file of settings (same names as the options, with _; ACP_CONFIG)",
    )
    parser.add_argument("--host", help="address to listen on (ACP_HOST; default 127.0.0.1)")
    parser.add_argument(
        "--http-port", metavar="PORT", help="HTTP port, 0 for any (ACP_HTTP_PORT; default 8080)"
    )
    parser.add_argument(
        "--tls-cert", metavar="FILE", help="PEM certificate: serve TLS (ACP_TLS_CERT; default: none)"
    )
    parser.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert (ACP_TLS_KEY)")
    parser.add_argument(
        "--insecure",
        action="store_const",
        const=True,
        default=None,
        help="allow plain text on a non-loopback address (ACP_INSECURE)",
    )
    parser.add_argument(
        "--cors-origin",
        action="append",
        dest="cors_origins",
        default=None,
        metavar="ORIGIN",
        help="allow browser calls from this origin (repeatable; ACP_CORS_ORIGIN, comma separated)",
    )
    parser.add_argument(
        "--max-body-bytes",
        metavar="BYTES",
        help="largest request body or gRPC message (ACP_MAX_BODY_BYTES; default 4 MiB)",
    )
    parser.add_argument(
        "--max-header-bytes",
        metavar="BYTES",
        help="largest request line and headers (ACP_MAX_HEADER_BYTES; default 64 KiB)",
    )
    parser.add_argument(
        "--header-timeout",
        metavar="SECONDS",
        help="time for a request's headers to arrive (ACP_HEADER_TIMEOUT; default 10)",
    )
    parser.add_argument(
        "--body-timeout",
        metavar="SECONDS",
        help="time for a request's body to arrive after its headers (ACP_BODY_TIMEOUT; default 60)",
    )
    parser.add_argument(
        "--idle-timeout",
        metavar="SECONDS",
        help="how long an idle keep-alive HTTP connection stays open (ACP_IDLE_TIMEOUT; default 5)",
    )
    parser.add_argument(
        "--max-connections",
        metavar="N",
        help="open HTTP connections in all (ACP_MAX_CONNECTIONS; default 2048)",
    )
    parser.add_argument(
        "--max-connections-per-client",
        metavar="N",
        help="open HTTP connections from one address (ACP_MAX_CONNECTIONS_PER_CLIENT; default 256)",
    )
    parser.add_argument(
        "--sse-keepalive",
        metavar="SECONDS",
        help="keep-alive comment interval of idle SSE streams (ACP_SSE_KEEPALIVE; default 15)",
    )
    parser.add_argument(
        "--grace-seconds",
        metavar="SECONDS",
        help="how long in-flight calls may finish at shutdown (ACP_GRACE_SECONDS; default 10)",
    )
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        help="(ACP_LOG_LEVEL; default warning)",
    )


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    serve = subparsers.add_parser(
        "serve",
        help="serve ACP over gRPC and JSON/HTTP",
        description="Serves every ACP operation over gRPC and the JSON/HTTP gateway, from one "
        "process sharing one facade and store. Every operation but meta.version needs a token.",
    )
    _common_options(serve)
    serve.add_argument(
        "--grpc-port", metavar="PORT", help="gRPC port, 0 for any (ACP_GRPC_PORT; default 50051)"
    )
    serve.add_argument(
        "--db",
        metavar="FILE",
        help="SQLite file (ACP_DB; default: acp.db in --state-dir, else the user's data directory)",
    )
    serve.add_argument("--tokens", metavar="FILE", help="token file (ACP_TOKENS)")
    serve.add_argument(
        "--state-dir",
        metavar="DIR",
        help="keep the database and token file in DIR; on first start create a token for "
        "namespace 'default' and print it once (ACP_STATE_DIR; what `make serve` uses)",
    )
    serve.add_argument(
        "--resource-root",
        action="append",
        dest="resource_roots",
        default=None,
        metavar="DIR",
        help="directory resources must lie inside DIR (repeatable; {namespace} in DIR names a "
        "per-namespace folder; ACP_RESOURCE_ROOTS, separated by ':'); with none, no directory resource",
    )
    serve.add_argument(
        "--allow-commands",
        action="store_const",
        const=True,
        default=None,
        help="run command tools and command validations (off by default; ACP_ALLOW_COMMANDS)",
    )
    serve.add_argument(
        "--command-user",
        metavar="USER",
        help="unprivileged account commands run as; needed with --allow-commands when serving "
        "as root (ACP_COMMAND_USER)",
    )
    serve.set_defaults(handler=serve_command)

    gateway = subparsers.add_parser(
        "gateway",
        help="serve the JSON/HTTP gateway in front of a remote gRPC server",
        description="Runs the HTTP gateway alone; every call goes to the upstream ACP gRPC server "
        "with the caller's token and request id, which does all checks.",
    )
    _common_options(gateway)
    gateway.add_argument(
        "--upstream", metavar="HOST:PORT", help="the ACP gRPC server (ACP_UPSTREAM; required)"
    )
    gateway.add_argument(
        "--upstream-ca",
        metavar="FILE",
        help="CA bundle of the upstream's certificate: use TLS upstream (ACP_UPSTREAM_CA)",
    )
    gateway.add_argument(
        "--upstream-tls",
        action="store_const",
        const=True,
        default=None,
        help="use TLS upstream with the system's CAs (ACP_UPSTREAM_TLS)",
    )
    gateway.set_defaults(handler=gateway_command)


def _fail(command: str, message: str) -> int:
    print(f"agents {command}: {message}", file=sys.stderr)
    return 2


def _settings(args: argparse.Namespace, model: Any) -> Any:
    """The command's settings: its flags over the environment over the config file."""
    from cleveragents.acp.gateway.settings import load

    flags = {name: getattr(args, name, None) for name in model.model_fields}
    settings = load(model, flags, config=args.config)
    logging.getLogger().setLevel(settings.log_level.upper())
    return settings


def _config(settings: Any, grpc_port: int | None) -> Any:
    from cleveragents.acp.facade.handlers.meta import server_build
    from cleveragents.acp.gateway.http.app import GatewaySettings
    from cleveragents.acp.gateway.http.protocol import ConnectionLimits
    from cleveragents.acp.gateway.server import ServerConfig, TLSFiles

    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise ValueError("give both --tls-cert and --tls-key, or neither")
    tls = TLSFiles(settings.tls_cert, settings.tls_key) if settings.tls_cert is not None else None
    return ServerConfig(
        host=settings.host,
        http_port=settings.http_port,
        grpc_port=grpc_port,
        tls=tls,
        insecure=settings.insecure,
        http=GatewaySettings(
            max_body_bytes=settings.max_body_bytes,
            keepalive_seconds=settings.sse_keepalive,
            cors_origins=settings.cors_origins,
            server_build=server_build(),
        ),
        connections=ConnectionLimits(
            max_header_bytes=settings.max_header_bytes,
            header_timeout=settings.header_timeout,
            body_timeout=settings.body_timeout,
            idle_timeout=settings.idle_timeout,
            max_connections=settings.max_connections,
            max_connections_per_client=settings.max_connections_per_client,
        ),
        grace_seconds=settings.grace_seconds,
        log_level=settings.log_level,
    )


def _ready_line(http_url: str, grpc_target: str | None) -> str:
    return "acp-ready " + json.dumps({"http": http_url, "grpc": grpc_target, "pid": os.getpid()})


def example_curl(http_url: str, token: str, operation: str, *, cacert: pathlib.Path | None = None) -> str:
    parts = ["curl", "-sS"]
    if cacert is not None:
        parts += ["--cacert", str(cacert)]
    parts += [
        "-H",
        f"Authorization: Bearer {token}",
        "-H",
        "Content-Type: application/json",
        "-d",
        json.dumps({"operation": operation, "params": {}}),
        f"{http_url}/api/v1/acp",
    ]
    return shlex.join(parts)


def _example_operation(served: frozenset[str]) -> str:
    """A served operation that needs the token and no parameters, to show the token works."""
    from cleveragents.acp.contract import catalog
    from cleveragents.acp.contract.required import required_fields

    preferred = ["session.list", "actor.list", "plan.list"]
    candidates = [
        op.name
        for op in catalog.OPERATIONS.values()
        if op.name in served
        and not op.anonymous
        and not op.server_streaming
        and not required_fields(op.request_type.DESCRIPTOR)
        and op.verb == "list"
    ]
    for name in preferred:
        if name in candidates:
            return name
    return candidates[0] if candidates else "meta.version"


def serve_command(args: argparse.Namespace) -> int:
    from cleveragents.acp.gateway.settings import ServeSettings, SettingsError

    try:
        settings = _settings(args, ServeSettings)
    except SettingsError as exc:
        return _fail("serve", str(exc))
    state_dir: pathlib.Path | None = settings.state_dir
    tokens: pathlib.Path | None = settings.tokens
    db: pathlib.Path | None = settings.db
    if state_dir is not None:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tokens = tokens or state_dir / "tokens.toml"
        db = db or state_dir / "acp.db"
    if tokens is None:
        return _fail(
            "serve",
            "server mode needs a token file: give --tokens FILE (create one with "
            "`agents token create --tokens FILE --name NAME --namespace NS`) or --state-dir DIR",
        )
    if state_dir is None and not tokens.exists():
        return _fail(
            "serve",
            f"token file {tokens} does not exist; create it with "
            f"`agents token create --tokens {tokens} --name NAME --namespace NS`",
        )
    from cleveragents.acp.facade import auth

    try:
        config = _config(settings, settings.grpc_port)
        if tokens.exists():
            auth.load(tokens)
    except (ValueError, auth.TokenFileError) as exc:
        return _fail("serve", str(exc))
    from cleveragents.acp.facade.factory import server_policy

    try:
        policy = server_policy(
            settings.resource_roots,
            allow_commands=settings.allow_commands,
            command_user=settings.command_user,
        )
    except ValueError as exc:
        return _fail("serve", str(exc))
    first_start = state_dir is not None and not tokens.exists()
    return asyncio.run(_serve(config, db, tokens, policy, dev=state_dir is not None, first_start=first_start))


async def _serve(
    config: Any, db: pathlib.Path | None, tokens: pathlib.Path, policy: Any, *, dev: bool, first_start: bool
) -> int:
    from cleveragents.acp.client.local import LocalTransport
    from cleveragents.acp.facade import auth
    from cleveragents.acp.facade.factory import default_db_path, open_facade
    from cleveragents.acp.gateway.server import ServeError, Server

    authenticator = auth.TokenAuthenticator(tokens)
    db = db or default_db_path()
    facade = open_facade(db, authenticator=authenticator, policy=policy)
    server = Server(config, transport=LocalTransport(facade), facade=facade)
    try:
        addresses = await server.start()
    except ServeError as exc:
        return _fail("serve", str(exc))
    server.install_signal_handlers()
    try:
        token = None
        if first_start:
            token = auth.create_token(tokens, DEV_PRINCIPAL, [DEV_NAMESPACE])
        lines = [
            "ACP server listening",
            f"  HTTP    {addresses.http_url}   (agents --server {addresses.http_url}; "
            f"envelope: POST {addresses.http_url}/api/v1/acp)",
            f"  console {addresses.http_url}/   (API docs: {addresses.http_url}/api/v1/docs)",
            f"  gRPC    {addresses.grpc_target}   (reflection and health on)",
            f"  store   {db}",
            f"  tokens  {tokens}",
        ]
        if token is not None:
            operation = _example_operation(facade.served_operations)
            cacert = config.tls.cert if config.tls is not None else None
            lines += [
                "",
                f"A token for namespace {DEV_NAMESPACE!r} (principal {DEV_PRINCIPAL!r}), shown only now:",
                f"  {token}",
                "Try it:",
                f"  {example_curl(addresses.http_url, token, operation, cacert=cacert)}",
            ]
        elif dev:
            lines += [
                "",
                f"Tokens are in {tokens}, as hashes: a token is printed only when it is created.",
                f"A new one: agents token create --tokens {tokens} --name NAME --namespace {DEV_NAMESPACE}",
            ]
        print("\n".join(lines), flush=True)
        print(_ready_line(addresses.http_url, addresses.grpc_target), flush=True)
        await server.wait()
    finally:
        await server.stop()
    return 0


def gateway_command(args: argparse.Namespace) -> int:
    from cleveragents.acp.gateway.server import ServeError, check_exposure
    from cleveragents.acp.gateway.settings import GatewayCommandSettings

    try:
        settings = _settings(args, GatewayCommandSettings)
        config = _config(settings, None)
        host = settings.upstream.rsplit(":", 1)[0]
        tls = settings.upstream_tls or settings.upstream_ca is not None
        check_exposure(host, True if tls else None, settings.insecure, "reach the upstream over")
        root = settings.upstream_ca.read_bytes() if settings.upstream_ca is not None else None
    except (ValueError, ServeError, OSError) as exc:
        return _fail("gateway", str(exc))
    return asyncio.run(_gateway(config, settings.upstream, tls, root))


async def _gateway(config: Any, upstream: str, tls: bool, root: bytes | None) -> int:
    from cleveragents.acp.client.grpc_transport import GrpcTransport
    from cleveragents.acp.gateway.server import ServeError, Server

    transport = GrpcTransport.connect(upstream, tls=tls, root_certificates=root)
    server = Server(config, transport=transport)
    try:
        addresses = await server.start()
    except ServeError as exc:
        return _fail("gateway", str(exc))
    server.install_signal_handlers()
    try:
        print(
            f"ACP gateway listening\n"
            f"  HTTP    {addresses.http_url}   (agents --server {addresses.http_url})\n"
            f"  console {addresses.http_url}/\n  upstream {upstream}",
            flush=True,
        )
        print(_ready_line(addresses.http_url, None), flush=True)
        await server.wait()
    finally:
        await server.stop()
    return 0
