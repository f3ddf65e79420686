"""Where the CLI connects: flags win over ``ACP_*`` environment variables, which win over
a profile of the config file (``$XDG_CONFIG_HOME/cleveragents/acp.toml``)::

    default_profile = "prod"
    [profiles.prod]
    server = "https://acp.example.com"   # HTTP(S) gateway
    token = "acp_..."
    # grpc = "acp.example.com:50051"     # or gRPC
    # db = "/path/to/acp.db"             # or local mode
    # ca_cert = "/path/to/ca.pem"
    # acp_version = "1.1"
    # retry_attempts = 16                # calls the server never answered (1: no retry)
    # retry_seconds = 20

With neither a server nor a gRPC address the CLI runs in local mode, in-process, on
``--db`` / ``ACP_DB`` (default: the user's data directory).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import pathlib
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cleveragents.acp.contract.retry import Retrying, RetryPolicy

SETTINGS = ("server", "token", "grpc", "db", "ca_cert", "acp_version", "retry_attempts", "retry_seconds")


class ConfigError(Exception):
    """The config file or a connection option is unusable (exit 2)."""


def config_path() -> pathlib.Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(pathlib.Path.home() / ".config")
    return pathlib.Path(base) / "cleveragents" / "acp.toml"


_CONNECTION: tuple[tuple[str, str | None, str], ...] = (
    ("--server", "URL", "HTTP(S) gateway URL [ACP_SERVER]"),
    ("--token", "TOKEN", "bearer token for server mode [ACP_TOKEN]"),
    ("--grpc", "HOST:PORT", "gRPC server address [ACP_GRPC]"),
    ("--db", "FILE", "local mode database [ACP_DB]"),
    ("--ca-cert", "FILE", "CA certificate for TLS [ACP_CA_CERT]"),
    ("--acp-version", "X.Y", "ACP version to speak [ACP_VERSION]"),
    ("--profile", "NAME", "profile of the config file [ACP_PROFILE]"),
    (
        "--retry-attempts",
        "N",
        "attempts in all at a call the server never answered (connection refused or lost); "
        "1 turns retrying off (default 16) [ACP_RETRY_ATTEMPTS]",
    ),
    (
        "--retry-seconds",
        "SECONDS",
        "no retry starts later than this after the first failure (default 20) [ACP_RETRY_SECONDS]",
    ),
)
_OUTPUT: tuple[tuple[str, str | None, str], ...] = (
    ("--json", None, "print the response data as JSON (for scripts)"),
    ("--envelope", None, "print the whole ACP JSON envelope"),
    ("--value", "PATH", "print only the value at PATH of the response data, e.g. plan.meta.id"),
)


GLOBAL_PREFIX = "global_"


def add_options(
    parser: argparse.ArgumentParser, *, top_level: bool = False, taken: frozenset[str] = frozenset()
) -> None:
    """Connection and output options, on each command that connects and on the top-level
    parser (there under ``global_*`` names, so ``agents --server URL plan list`` works and
    ``serve``'s own ``--db`` is not overwritten). Flags in ``taken`` (a request field of the
    same name) are left to the top level."""
    prefix = GLOBAL_PREFIX if top_level else ""
    for title, options in (("connection", _CONNECTION), ("output", _OUTPUT)):
        group = parser.add_argument_group(title)
        for flag, var, text in options:
            if flag in taken:
                continue
            dest = prefix + flag.removeprefix("--").replace("-", "_")
            if var is None:
                group.add_argument(flag, dest=dest, action="store_true", default=None, help=text)
            else:
                group.add_argument(flag, dest=dest, default=None, metavar=var, help=text)


def option(args: argparse.Namespace, name: str) -> Any:
    """An option's value, given after the command or before it."""
    value = getattr(args, name, None)
    return value if value is not None else getattr(args, GLOBAL_PREFIX + name, None)


def given_globally(args: argparse.Namespace) -> list[str]:
    """The options given before the command, as flags."""
    return [
        "--" + key.removeprefix(GLOBAL_PREFIX).replace("_", "-")
        for key, value in vars(args).items()
        if key.startswith(GLOBAL_PREFIX) and value is not None
    ]


@dataclass(frozen=True)
class Connection:
    server: str | None
    token: str | None
    grpc: str | None
    db: str | None
    ca_cert: str | None
    acp_version: str | None
    retry_attempts: str | None = None
    retry_seconds: str | None = None

    @property
    def where(self) -> str:
        if self.server:
            return self.server
        if self.grpc:
            return f"grpc://{self.grpc}"
        return f"local database {self.db or '(default)'}"


def _profile(name: str | None) -> dict[str, Any]:
    path = config_path()
    if not path.exists():
        if name:
            raise ConfigError(f"profile {name!r} asked for, but {path} does not exist")
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    profiles = data.get("profiles", {})
    chosen = name or data.get("default_profile")
    if not chosen:
        return {}
    if not isinstance(profiles, dict) or chosen not in profiles or not isinstance(profiles[chosen], dict):
        raise ConfigError(f"{path} has no profile {chosen!r}")
    unknown = set(profiles[chosen]) - set(SETTINGS)
    if unknown:
        raise ConfigError(f"{path}: profile {chosen!r} has unknown keys {sorted(unknown)}")
    return dict(profiles[chosen])


def resolve(args: argparse.Namespace) -> Connection:
    profile = _profile(option(args, "profile") or os.environ.get("ACP_PROFILE"))
    values: dict[str, str | None] = {}
    for key in SETTINGS:
        flag = option(args, key)
        env = os.environ.get(f"ACP_{key.upper()}")
        given = flag or env or profile.get(key)
        values[key] = None if given is None else str(given)
    if values["server"] and values["grpc"]:
        raise ConfigError("give either a server URL or a gRPC address, not both")
    server = values["server"]
    if server and not server.startswith(("http://", "https://")):
        raise ConfigError(f"server {server!r}: expected a URL such as http://127.0.0.1:8080")
    if server:
        values["server"] = server_origin(server)
    _check_grpc(values["grpc"])
    if values["token"] and not (server or values["grpc"]):
        raise ConfigError(
            "a token is for a server, but neither --server URL nor --grpc HOST:PORT is given "
            "(local mode has no authentication)"
        )
    if values["db"] and "://" in values["db"]:
        # Imported only here: the facade is heavy, and most commands give no URL.
        from cleveragents.acp.facade.factory import db_problem

        problem = db_problem(values["db"])
        if problem is not None:
            raise ConfigError(problem)
    conn = Connection(**values)
    retry_policy(conn)
    return conn


# gRPC's own name-resolver schemes (``dns:///host:port``, ``unix:///path``) are targets too.
_GRPC_SCHEMES = ("dns:", "unix:", "unix-abstract:", "ipv4:", "ipv6:", "vsock:")


def _check_grpc(target: str | None) -> None:
    """``--grpc http://host:port`` is not a gRPC target: refused, rather than retried."""
    if target and "://" in target and not target.startswith(_GRPC_SCHEMES):
        raise ConfigError(
            f"gRPC address {target!r}: expected HOST:PORT such as 127.0.0.1:50051, not a URL "
            "(an http:// or https:// URL is for --server)"
        )


def retry_policy(conn: Connection, notify: Callable[[Retrying], None] | None = None) -> RetryPolicy:
    """The retry policy the connection's settings ask for (``ConfigError`` when unusable)."""
    default = RetryPolicy()
    try:
        attempts = int(conn.retry_attempts) if conn.retry_attempts else default.attempts
        seconds = float(conn.retry_seconds) if conn.retry_seconds else default.deadline
        if not math.isfinite(seconds):
            raise ValueError("retry seconds must be finite")
        return dataclasses.replace(default, attempts=attempts, deadline=seconds, notify=notify)
    except ValueError as exc:
        raise ConfigError(
            f"retry settings: attempts {conn.retry_attempts!r}, seconds {conn.retry_seconds!r}: "
            "expected a whole number of attempts of at least 1 and seconds of at least 0"
        ) from exc


_API_SUFFIXES = ("/api/v1/acp", "/api/v1")


def server_origin(url: str) -> str:
    """The gateway's base URL: the API address a server prints (``…/api/v1``) or its
    envelope endpoint (``…/api/v1/acp``) name the same server as its origin."""
    base = url.rstrip("/")
    for suffix in _API_SUFFIXES:
        if base.endswith(suffix):
            return base.removesuffix(suffix)
    return base
