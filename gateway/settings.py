"""The settings of ``agents serve`` and ``agents gateway``: one pydantic model, filled from
the command line over ``ACP_*`` environment variables over a TOML file (``--config FILE`` or
``$ACP_CONFIG``), each value checked once whatever its source, and a refusal naming both
the setting and where its value came from.

The file holds the same names as the flags, with underscores::

    host = "127.0.0.1"
    http_port = 8080
    cors_origins = ["https://app.example"]
    max_body_bytes = 4194304
    resource_roots = ["/srv/acp/{namespace}"]
    model_endpoints = ["https://api.openai.com/v1"]
    model_key_envs = ["OPENAI_API_KEY"]
"""

from __future__ import annotations

import os
import pathlib
import tomllib
from collections.abc import Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cleveragents.acp.contract import limits

Port = Annotated[int, Field(ge=0, le=65535, description="0 picks a free port")]


S = TypeVar("S", bound="HTTPSettings")


class SettingsError(ValueError):
    """Settings that cannot be used; the message names the setting and its source."""


class HTTPSettings(BaseModel):
    """What both commands take."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    host: str = Field(default="127.0.0.1", min_length=1)
    http_port: Port = 8080
    tls_cert: pathlib.Path | None = None
    tls_key: pathlib.Path | None = None
    insecure: bool = False
    cors_origins: tuple[str, ...] = ()
    max_body_bytes: int = Field(default=limits.DEFAULT_MAX_BODY_BYTES, ge=1)
    max_header_bytes: int = Field(default=limits.DEFAULT_MAX_HEADER_BYTES, ge=1024)
    header_timeout: float = Field(default=limits.DEFAULT_HEADER_TIMEOUT, gt=0)
    body_timeout: float = Field(default=limits.DEFAULT_BODY_TIMEOUT, gt=0)
    idle_timeout: int = Field(default=limits.DEFAULT_IDLE_TIMEOUT, ge=1)
    # 0 turns the minimum body rate off (the body timeout alone bounds a body then).
    min_body_rate: int = Field(default=limits.MIN_BODY_RATE, ge=0)
    min_body_rate_grace: float = Field(default=limits.MIN_BODY_RATE_GRACE, gt=0)
    max_connections: int = Field(default=limits.DEFAULT_MAX_CONNECTIONS, ge=1)
    max_connections_per_client: int = Field(default=limits.DEFAULT_MAX_CONNECTIONS_PER_CLIENT, ge=1)
    sse_keepalive: float = Field(default=15.0, gt=0)
    grace_seconds: float = Field(default=10.0, gt=0)
    log_level: Literal["debug", "info", "warning", "error"] = "warning"
    # auto: JSON when stdout is not a terminal, readable text on one.
    log_format: Literal["auto", "json", "text"] = "auto"
    access_log: bool = True
    # None: /metrics on the HTTP port, to loopback clients only.
    metrics_port: Port | None = None
    # auto: uvloop where it is installed, asyncio's own loop elsewhere (gateway/loops.py).
    loop: Literal["auto", "asyncio", "uvloop"] = "auto"

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split(cls, value: Any) -> Any:
        """A comma-separated string (how the environment gives a list) or a list."""
        if isinstance(value, str):
            return tuple(item.strip() for item in value.split(",") if item.strip())
        return value

    @field_validator("log_level", "log_format", "loop", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value


class ServeSettings(HTTPSettings):
    grpc_port: Port = 50051
    # A SQLite file, or a postgresql:// URL (kept a string: a path would fold its "//").
    db: str | None = Field(default=None, min_length=1)
    tokens: pathlib.Path | None = None
    state_dir: pathlib.Path | None = None
    # Folders directory resources may live in; "{namespace}" names a per-namespace one.
    resource_roots: tuple[str, ...] = ()
    # Whether command tools and command validations run processes at all.
    allow_commands: bool = False
    # The base URLs (scheme, host, port, path prefix) model actors may send requests to, and
    # the environment variables they may name as api_key_env; none: no model actor.
    model_endpoints: tuple[str, ...] = ()
    model_key_envs: tuple[str, ...] = ()
    # Webhooks (docs/webhooks.md): plain http allowed, and the networks (CIDR) they may reach
    # beyond global addresses (loopback, private, link-local and metadata ranges are refused).
    webhook_allow_http: bool = False
    webhook_allow_networks: tuple[str, ...] = ()
    # The account processes run as when the server runs as root.
    command_user: str | None = Field(default=None, min_length=1)
    # Seconds a mutating call's answer is kept for a retry with its request id (docs/idempotency.md).
    request_retention: float = Field(default=24 * 3600.0, gt=0, le=30 * 24 * 3600.0)
    # Worker processes sharing the ports (SO_REUSEPORT), the store and the event log.
    workers: int = Field(default=1, ge=1, le=64)

    @field_validator("resource_roots", mode="before")
    @classmethod
    def _roots(cls, value: Any) -> Any:
        """``os.pathsep``-separated in the environment, a list elsewhere; each absolute."""
        if isinstance(value, str):
            value = tuple(item for item in value.split(os.pathsep) if item)
        for root in value or ():
            if not isinstance(root, str) or not os.path.isabs(root):
                raise ValueError(f"{root!r} is not an absolute path")
        return value

    @field_validator("model_endpoints", "model_key_envs", "webhook_allow_networks", mode="before")
    @classmethod
    def _listed(cls, value: Any) -> Any:
        """Comma-separated in the environment, a list elsewhere."""
        if isinstance(value, str):
            return tuple(item.strip() for item in value.split(",") if item.strip())
        return value


class GatewayCommandSettings(HTTPSettings):
    upstream: str = Field(min_length=1)
    upstream_ca: pathlib.Path | None = None
    upstream_tls: bool = False


# The environment variable of each setting (ACP_ and the name upper-cased), except these.
_ENV_NAMES = {"cors_origins": "ACP_CORS_ORIGIN"}
_FLAG_NAMES = {
    "cors_origins": "--cors-origin",
    "resource_roots": "--resource-root",
    "model_endpoints": "--model-endpoint",
    "model_key_envs": "--model-key-env",
    "webhook_allow_networks": "--webhook-allow-network",
}


def env_name(field: str) -> str:
    return _ENV_NAMES.get(field, "ACP_" + field.upper())


def flag_name(field: str) -> str:
    return _FLAG_NAMES.get(field, "--" + field.replace("_", "-"))


def _file(path: pathlib.Path) -> dict[str, Any]:
    try:
        document = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SettingsError(f"cannot read the config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
    return document


def load(
    model: type[S],
    flags: Mapping[str, Any],
    *,
    environ: Mapping[str, str] | None = None,
    config: pathlib.Path | None = None,
) -> S:
    """``model`` from ``flags`` (the options given; None: not given) over the environment over
    the config file (``config``, else ``$ACP_CONFIG``)."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    path = config or (pathlib.Path(environ["ACP_CONFIG"]) if environ.get("ACP_CONFIG") else None)
    if path is not None:
        for key, value in _file(path).items():
            values[key], sources[key] = value, f"config file {path}"
    for field in model.model_fields:
        raw = environ.get(env_name(field), "")
        if raw != "":
            values[field], sources[field] = raw, f"${env_name(field)}"
    for field, value in flags.items():
        if value is not None:
            values[field], sources[field] = value, flag_name(field)
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else ""
            where = sources.get(field, "the defaults")
            if error["type"] == "extra_forbidden":
                problems.append(f"unknown setting {field!r} (from {where})")
            elif error["type"] == "missing":
                problems.append(
                    f"{flag_name(field)} is required (or ${env_name(field)}, or {field} in the config file)"
                )
            else:
                problems.append(f"{field}: {error['msg']} (got {error.get('input')!r} from {where})")
        raise SettingsError("; ".join(problems)) from None
