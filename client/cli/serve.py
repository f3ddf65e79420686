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
import os
import pathlib
import shlex
import sys
from typing import Any

from cleveragents.acp.client.cli.options import env, env_flag, env_list, port, positive_float, positive_int

DEV_PRINCIPAL = "dev"
DEV_NAMESPACE = "default"


def _common_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default=env("ACP_HOST", "127.0.0.1"), help="address to listen on (ACP_HOST)"
    )
    parser.add_argument(
        "--http-port", type=port, default=env("ACP_HTTP_PORT", "8080"), help="HTTP port (ACP_HTTP_PORT)"
    )
    parser.add_argument("--tls-cert", type=pathlib.Path, default=env("ACP_TLS_CERT"), help="PEM certificate")
    parser.add_argument("--tls-key", type=pathlib.Path, default=env("ACP_TLS_KEY"), help="PEM private key")
    parser.add_argument(
        "--insecure",
        action="store_true",
        default=env_flag("ACP_INSECURE"),
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
        type=positive_int,
        default=env("ACP_MAX_BODY_BYTES", str(4 * 1024 * 1024)),
        help="largest request body or gRPC message (ACP_MAX_BODY_BYTES)",
    )
    parser.add_argument(
        "--sse-keepalive",
        type=positive_float,
        default=env("ACP_SSE_KEEPALIVE", "15"),
        metavar="SECONDS",
        help="keep-alive comment interval of idle SSE streams (ACP_SSE_KEEPALIVE)",
    )
    parser.add_argument(
        "--grace-seconds",
        type=positive_float,
        default=env("ACP_GRACE_SECONDS", "10"),
        help="how long in-flight calls may finish at shutdown (ACP_GRACE_SECONDS)",
    )
    parser.add_argument(
        "--log-level",
        choices=["debug", "info", "warning", "error"],
        default=env("ACP_LOG_LEVEL", "warning"),
        help="(ACP_LOG_LEVEL)",
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
        "--grpc-port", type=port, default=env("ACP_GRPC_PORT", "50051"), help="gRPC port (ACP_GRPC_PORT)"
    )
    serve.add_argument("--db", type=pathlib.Path, default=env("ACP_DB"), help="SQLite file (ACP_DB)")
    serve.add_argument(
        "--tokens",
        type=pathlib.Path,
        default=env("ACP_TOKENS"),
        metavar="FILE",
        help="token file (ACP_TOKENS)",
    )
    serve.add_argument(
        "--state-dir",
        type=pathlib.Path,
        default=env("ACP_STATE_DIR"),
        metavar="DIR",
        help="keep the database and token file in DIR; on first start create a token for "
        "namespace 'default' and print it once (ACP_STATE_DIR; what `make serve` uses)",
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
        "--upstream",
        default=env("ACP_UPSTREAM"),
        required=env("ACP_UPSTREAM") is None,
        metavar="HOST:PORT",
        help="the ACP gRPC server (ACP_UPSTREAM)",
    )
    gateway.add_argument(
        "--upstream-ca",
        type=pathlib.Path,
        default=env("ACP_UPSTREAM_CA"),
        metavar="FILE",
        help="CA bundle of the upstream's certificate: use TLS upstream (ACP_UPSTREAM_CA)",
    )
    gateway.add_argument(
        "--upstream-tls",
        action="store_true",
        default=env_flag("ACP_UPSTREAM_TLS"),
        help="use TLS upstream with the system's CAs (ACP_UPSTREAM_TLS)",
    )
    gateway.set_defaults(handler=gateway_command)


def _fail(command: str, message: str) -> int:
    print(f"agents {command}: {message}", file=sys.stderr)
    return 2


def _config(args: argparse.Namespace, grpc_port: int | None) -> Any:
    from cleveragents.acp.gateway.http.app import GatewaySettings
    from cleveragents.acp.gateway.server import ServerConfig, TLSFiles

    if (args.tls_cert is None) != (args.tls_key is None):
        raise ValueError("give both --tls-cert and --tls-key, or neither")
    tls = TLSFiles(args.tls_cert, args.tls_key) if args.tls_cert is not None else None
    origins = args.cors_origins if args.cors_origins is not None else env_list("ACP_CORS_ORIGIN")
    from cleveragents.acp.facade.handlers.meta import server_build

    return ServerConfig(
        host=args.host,
        http_port=args.http_port,
        grpc_port=grpc_port,
        tls=tls,
        insecure=args.insecure,
        http=GatewaySettings(
            max_body_bytes=args.max_body_bytes,
            keepalive_seconds=args.sse_keepalive,
            cors_origins=tuple(origins),
            server_build=server_build(),
        ),
        grace_seconds=args.grace_seconds,
        log_level=args.log_level,
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
    state_dir: pathlib.Path | None = args.state_dir
    tokens: pathlib.Path | None = args.tokens
    db: pathlib.Path | None = args.db
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
        config = _config(args, args.grpc_port)
        if tokens.exists():
            auth.load(tokens)
    except (ValueError, auth.TokenFileError) as exc:
        return _fail("serve", str(exc))
    first_start = state_dir is not None and not tokens.exists()
    return asyncio.run(_serve(config, db, tokens, dev=state_dir is not None, first_start=first_start))


async def _serve(
    config: Any, db: pathlib.Path | None, tokens: pathlib.Path, *, dev: bool, first_start: bool
) -> int:
    from cleveragents.acp.client.local import LocalTransport
    from cleveragents.acp.facade import auth
    from cleveragents.acp.facade.factory import default_db_path, open_facade
    from cleveragents.acp.gateway.server import ServeError, Server

    authenticator = auth.TokenAuthenticator(tokens)
    db = db or default_db_path()
    facade = open_facade(db, authenticator=authenticator)
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
            f"  HTTP    {addresses.http_url}/api/v1   (envelope: POST {addresses.http_url}/api/v1/acp)",
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
    try:
        config = _config(args, None)
        from cleveragents.acp.gateway.server import ServeError, check_exposure

        host = args.upstream.rsplit(":", 1)[0]
        tls = args.upstream_tls or args.upstream_ca is not None
        check_exposure(host, True if tls else None, args.insecure, "reach the upstream over")
        root = args.upstream_ca.read_bytes() if args.upstream_ca is not None else None
    except (ValueError, ServeError, OSError) as exc:
        return _fail("gateway", str(exc))
    return asyncio.run(_gateway(config, args.upstream, tls, root))


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
            f"ACP gateway listening\n  HTTP    {addresses.http_url}/api/v1\n"
            f"  console {addresses.http_url}/\n  upstream {upstream}",
            flush=True,
        )
        print(_ready_line(addresses.http_url, None), flush=True)
        await server.wait()
    finally:
        await server.stop()
    return 0
