"""What a process of ``agents serve`` does before it listens and prints once it does,
shared by the one-process server (``gateway.assembly``) and each of its workers
(``gateway.workers``): the settings checked and resolved with the facade's opener
(``prepare``), the banner and the ``acp-ready`` line, a refusal's one line on stderr (``fail``).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import shlex
import sqlite3
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.required import required_fields
from cleveragents.acp.facade import auth
from cleveragents.acp.facade.factory import (
    WorkerSlot,
    default_db_path,
    describe_db,
    open_facade,
    server_policy,
)
from cleveragents.acp.facade.handlers.meta import server_build
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.gateway import loops
from cleveragents.acp.gateway.http.endpoint import GatewaySettings
from cleveragents.acp.gateway.http.protocol import ConnectionLimits
from cleveragents.acp.gateway.server import Addresses, ServeError, ServerConfig, TLSFiles
from cleveragents.acp.gateway.settings import HTTPSettings, ServeSettings, SettingsError, load

DEV_PRINCIPAL = "dev"
DEV_NAMESPACE = "default"

S = TypeVar("S", bound=HTTPSettings)


def fail(command: str, message: str) -> int:
    """A refusal: its one line on stderr, and the exit code."""
    print(f"agents {command}: {message}", file=sys.stderr)
    return 2


def command_settings(flags: Mapping[str, Any], config: pathlib.Path | None, model: type[S]) -> S:
    """The command's settings: its flags over the environment over the config file."""
    settings = load(model, {name: flags.get(name) for name in model.model_fields}, config=config)
    logging.getLogger().setLevel(settings.log_level.upper())
    return settings


def server_config(settings: HTTPSettings, grpc_port: int | None) -> ServerConfig:
    cert, key = settings.tls_cert, settings.tls_key
    if (cert is None) != (key is None):
        raise ValueError("give both --tls-cert and --tls-key, or neither")
    tls = TLSFiles(cert, key) if cert is not None and key is not None else None
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
            min_body_rate=settings.min_body_rate,
            min_body_rate_grace=settings.min_body_rate_grace,
            idle_timeout=settings.idle_timeout,
            max_connections=settings.max_connections,
            max_connections_per_client=settings.max_connections_per_client,
        ),
        grace_seconds=settings.grace_seconds,
        log_level=settings.log_level,
        manage_logging=True,
        log_format=settings.log_format,
        access_log=settings.access_log,
        metrics_port=settings.metrics_port,
    )


def ready_line(http_url: str, grpc_target: str | None, **more: object) -> str:
    return "acp-ready " + json.dumps({"http": http_url, "grpc": grpc_target, "pid": os.getpid(), **more})


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


@dataclass(frozen=True)
class Prepared:
    """``agents serve`` checked and resolved, before anything listens."""

    settings: ServeSettings
    config: ServerConfig
    # A SQLite file or a PostgreSQL URL.
    db: str | pathlib.Path
    tokens: pathlib.Path
    dev: bool
    first_start: bool
    open: Callable[[WorkerSlot | None], ServiceFacade]

    def opening(self, worker: WorkerSlot | None) -> Callable[[], ServiceFacade]:
        """What the server calls (off the loop, once it listens) to open the facade; an
        unreachable database, a file that is not one, a schema too new: one line."""

        def opening() -> ServiceFacade:
            try:
                return self.open(worker)
            except (OSError, ValueError, sqlite3.Error) as exc:
                raise ServeError(f"cannot open the store {describe_db(self.db)}: {exc}") from None

        return opening


def prepare(flags: Mapping[str, Any], config: pathlib.Path | None) -> Prepared | int:
    """The settings checked, the paths resolved and the facade's opener; or the exit code of
    a refusal (already reported on stderr)."""
    try:
        settings = command_settings(flags, config, ServeSettings)
        loops.resolve(settings.loop)
    except (SettingsError, loops.LoopUnavailableError) as exc:
        return fail("serve", str(exc))
    state_dir: pathlib.Path | None = settings.state_dir
    tokens: pathlib.Path | None = settings.tokens
    db: str | pathlib.Path | None = settings.db
    if state_dir is not None:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        tokens = tokens or state_dir / "tokens.toml"
        db = db or state_dir / "acp.db"
    if tokens is None:
        return fail(
            "serve",
            "server mode needs a token file: give --tokens FILE (create one with "
            "`agents token create --tokens FILE --name NAME --namespace NS`) or --state-dir DIR",
        )
    if state_dir is None and not tokens.exists():
        return fail(
            "serve",
            f"token file {tokens} does not exist; create it with "
            f"`agents token create --tokens {tokens} --name NAME --namespace NS`",
        )
    try:
        server = server_config(settings, settings.grpc_port)
        if tokens.exists():
            auth.load(tokens)
    except (ValueError, auth.TokenFileError) as exc:
        return fail("serve", str(exc))
    try:
        policy = server_policy(
            settings.resource_roots,
            allow_commands=settings.allow_commands,
            command_user=settings.command_user,
            model_endpoints=settings.model_endpoints,
            model_key_envs=settings.model_key_envs,
            webhook_allow_http=settings.webhook_allow_http,
            webhook_allow_networks=settings.webhook_allow_networks,
        )
    except ValueError as exc:
        return fail("serve", str(exc))
    first_start = state_dir is not None and not tokens.exists()
    store = db or default_db_path()
    token_file = tokens

    def opened(worker: WorkerSlot | None) -> ServiceFacade:
        authenticator = auth.TokenAuthenticator(token_file)
        return open_facade(
            store,
            authenticator=authenticator,
            policy=policy,
            follow=True,
            request_retention=settings.request_retention,
            takeover=True,
            worker=worker,
        )

    return Prepared(settings, server, store, tokens, state_dir is not None, first_start, opened)


def first_token(prepared: Prepared) -> str | None:
    """The token printed on a ``--state-dir`` server's first start (None after that)."""
    if not prepared.first_start:
        return None
    return auth.create_token(prepared.tokens, DEV_PRINCIPAL, [DEV_NAMESPACE], role="admin")


def banner(
    prepared: Prepared, addresses: Addresses, token: str | None, served: frozenset[str], workers: int = 1
) -> str:
    """What a started server prints before its ready line."""
    config = prepared.config
    lines = [
        "ACP server listening"
        + (f" ({workers} workers)" if workers > 1 else "")
        + f" on the {loops.resolve(prepared.settings.loop)} event loop",
        f"  HTTP    {addresses.http_url}   (agents --server {addresses.http_url}; "
        f"envelope: POST {addresses.http_url}/api/v1/acp)",
        f"  console {addresses.http_url}/   (API docs: {addresses.http_url}/api/v1/docs)",
        f"  gRPC    {addresses.grpc_target}   (reflection and health on)",
        f"  store   {describe_db(prepared.db)}",
        f"  tokens  {prepared.tokens}",
    ]
    if token is not None:
        operation = _example_operation(served)
        cacert = config.tls.cert if config.tls is not None else None
        lines += [
            "",
            f"A token for namespace {DEV_NAMESPACE!r} (principal {DEV_PRINCIPAL!r}), shown only now:",
            f"  {token}",
            "Try it:",
            f"  {example_curl(addresses.http_url, token, operation, cacert=cacert)}",
        ]
    elif prepared.dev:
        lines += [
            "",
            f"Tokens are in {prepared.tokens}, as hashes: a token is printed only when it is created.",
            f"A new one: agents token create --tokens {prepared.tokens} --name NAME "
            f"--namespace {DEV_NAMESPACE}",
        ]
    return "\n".join(lines)
