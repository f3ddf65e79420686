"""``agents serve`` (gRPC and the HTTP gateway over one facade) and ``agents gateway``
(the HTTP gateway alone, in front of an upstream gRPC server): their options. The server
itself is assembled by ``gateway.assembly``, the one module of the gateway the client
imports (an import-linter contract allows that import and no other); the gateway-only
mode's upstream is a ``GrpcTransport`` made here.

Once listening, both print the addresses and then one machine-readable line,
``acp-ready {"http": ..., "grpc": ...}``, which scripts and tests wait for (ports given as
0 are chosen by the system and reported there).
"""

from __future__ import annotations

import argparse
import pathlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Only a type here: the module is imported by every ``agents`` command.
    from cleveragents.acp.contract.transport import Transport

# The commands this module adds (``main`` builds only these for a line naming one).
NAMES = ("serve", "gateway")


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
        "--loop",
        choices=("auto", "asyncio", "uvloop"),
        help="event loop: auto is uvloop where installed, else asyncio's (ACP_LOOP; default auto)",
    )
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
        "--min-body-rate",
        metavar="BYTES",
        help="bytes a second a request body must average after the grace; 0: no minimum "
        "(ACP_MIN_BODY_RATE; default 240)",
    )
    parser.add_argument(
        "--min-body-rate-grace",
        metavar="SECONDS",
        help="seconds a request body has before its rate counts (ACP_MIN_BODY_RATE_GRACE; default 5)",
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
    parser.add_argument(
        "--log-format",
        choices=["auto", "json", "text"],
        help="log lines as JSON or text; auto: JSON unless stdout is a terminal (ACP_LOG_FORMAT)",
    )
    parser.add_argument(
        "--no-access-log",
        dest="access_log",
        action="store_const",
        const=False,
        default=None,
        help="no line per call and per stream (ACP_ACCESS_LOG=false)",
    )
    parser.add_argument(
        "--metrics-port",
        metavar="PORT",
        help="serve /metrics on this port, to anyone who reaches it; without it /metrics is on "
        "the HTTP port for loopback clients only (ACP_METRICS_PORT)",
    )


def register(subparsers: argparse._SubParsersAction[Any], words: Sequence[str] | None = None) -> None:
    """Adds ``serve`` and ``gateway`` (small enough to build in full whatever ``words`` is)."""
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
        metavar="FILE|URL",
        help="SQLite file, or a postgresql:// URL for a store shared by several replicas (ACP_DB; "
        "default: acp.db in --state-dir, else the user's data directory)",
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
        "--model-endpoint",
        action="append",
        dest="model_endpoints",
        default=None,
        metavar="URL",
        help="model actors may send requests to base URLs under URL (scheme, host, port and path "
        "prefix; repeatable; ACP_MODEL_ENDPOINTS, separated by ','); with none, no model actor",
    )
    serve.add_argument(
        "--model-key-env",
        action="append",
        dest="model_key_envs",
        default=None,
        metavar="NAME",
        help="model actors may name the server's environment variable NAME as api_key_env "
        "(repeatable; ACP_MODEL_KEY_ENVS, separated by ','); with none, no actor reads a key",
    )
    serve.add_argument(
        "--webhook-allow-http",
        action="store_const",
        const=True,
        default=None,
        help="webhooks may be plain http:// URLs (off by default: https only; ACP_WEBHOOK_ALLOW_HTTP)",
    )
    serve.add_argument(
        "--webhook-allow-network",
        action="append",
        dest="webhook_allow_networks",
        default=None,
        metavar="CIDR",
        help="webhooks may reach addresses in CIDR although not global (loopback, private, "
        "link-local: refused by default; repeatable; ACP_WEBHOOK_ALLOW_NETWORKS, separated by ',')",
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
    serve.add_argument(
        "--request-retention",
        metavar="SECONDS",
        help="how long the answer of a mutating call is kept, so a retry with the same request id "
        "gets it instead of running the call again (ACP_REQUEST_RETENTION; default 86400, 24 h)",
    )
    serve.add_argument(
        "--workers",
        metavar="N",
        help="worker processes on the same ports, one store and one event log; a crashed "
        "worker is restarted (ACP_WORKERS; default 1; see docs/server.md)",
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


def serve_command(args: argparse.Namespace) -> int:
    from cleveragents.acp.gateway import assembly

    return assembly.serve(vars(args), args.config)


def _connect(target: str, tls: bool, root: bytes | None) -> Transport:
    from cleveragents.acp.client.grpc_transport import GrpcTransport

    return GrpcTransport.connect(target, tls=tls, root_certificates=root)


def gateway_command(args: argparse.Namespace) -> int:
    from cleveragents.acp.gateway import assembly

    return assembly.gateway(vars(args), args.config, _connect)
