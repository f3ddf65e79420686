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

With neither a server nor a gRPC address the CLI runs in local mode, in-process, on
``--db`` / ``ACP_DB`` (default: the user's data directory).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import tomllib
from dataclasses import dataclass
from typing import Any

SETTINGS = ("server", "token", "grpc", "db", "ca_cert", "acp_version")


class ConfigError(Exception):
    """The config file or a connection option is unusable (exit 2)."""


def config_path() -> pathlib.Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(pathlib.Path.home() / ".config")
    return pathlib.Path(base) / "cleveragents" / "acp.toml"


def add_options(parser: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """Connection and output options; on subcommands too, so they may follow the command."""
    default: Any = argparse.SUPPRESS if suppress else None
    group = parser.add_argument_group("connection")
    group.add_argument("--server", default=default, metavar="URL", help="HTTP(S) gateway URL [ACP_SERVER]")
    group.add_argument("--token", default=default, help="bearer token for server mode [ACP_TOKEN]")
    group.add_argument("--grpc", default=default, metavar="HOST:PORT", help="gRPC server address [ACP_GRPC]")
    group.add_argument("--db", default=default, metavar="FILE", help="local mode database [ACP_DB]")
    group.add_argument(
        "--ca-cert", default=default, metavar="FILE", help="CA certificate for TLS [ACP_CA_CERT]"
    )
    group.add_argument(
        "--acp-version", default=default, metavar="X.Y", help="ACP version to speak [ACP_VERSION]"
    )
    group.add_argument("--profile", default=default, help="profile of the config file [ACP_PROFILE]")
    output = parser.add_argument_group("output")
    output.add_argument(
        "--json", action="store_true", default=default, help="print the response data as JSON"
    )
    output.add_argument(
        "--envelope", action="store_true", default=default, help="print the whole JSON envelope"
    )


@dataclass(frozen=True)
class Connection:
    server: str | None
    token: str | None
    grpc: str | None
    db: str | None
    ca_cert: str | None
    acp_version: str | None

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
    profile = _profile(getattr(args, "profile", None) or os.environ.get("ACP_PROFILE"))
    values: dict[str, str | None] = {}
    for key in SETTINGS:
        flag = getattr(args, key, None)
        env = os.environ.get(f"ACP_{key.upper()}")
        values[key] = flag or env or profile.get(key)
    if values["server"] and values["grpc"]:
        raise ConfigError("give either a server URL or a gRPC address, not both")
    return Connection(**values)
