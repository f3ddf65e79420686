"""ACP versions: the server speaks the current minor and one prior minor (ADR-026)."""

from __future__ import annotations

import functools

from cleveragents.acp.contract.errors import ACPError, ErrorCode

CURRENT = "1.1"
SUPPORTED: tuple[str, ...] = ("1.1", "1.0")
MAJOR_PREFIX = "/api/v1"


def _minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def negotiate(requested: str | None) -> str:
    """The version a request is served at; absent means the current one."""
    if requested is None or requested == "":
        return CURRENT
    if requested not in SUPPORTED:
        raise ACPError(
            ErrorCode.VERSION_MISMATCH,
            f"ACP version {requested!r} is not supported; this server speaks {', '.join(SUPPORTED)}",
            {"requested": requested, "supported_versions": list(SUPPORTED)},
        )
    return requested


@functools.cache
def _newer(since: str, version: str) -> bool:
    return _minor(since) > _minor(version)


def check_operation(version: str, operation: str, since: str) -> None:
    """Refuse an operation newer than the version the client speaks."""
    if _newer(since, version):
        raise ACPError(
            ErrorCode.VERSION_MISMATCH,
            f"{operation} was introduced in ACP {since}; the request speaks {version}",
            {
                "operation": operation,
                "since": since,
                "requested": version,
                "supported_versions": list(SUPPORTED),
            },
        )
