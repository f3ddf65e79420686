"""ACP versions: the server speaks the current minor and one prior minor (ADR-026).

``SUPPORTED`` is newest first. Every operation, field and event type records the minor that
introduced it (``contract/surface.py``), so a client speaking an older minor sees exactly its
surface.
"""

from __future__ import annotations

import functools
import re

from cleveragents.acp.contract.errors import ACPError, ErrorCode

CURRENT = "1.2"
SUPPORTED: tuple[str, ...] = ("1.2", "1.1")
# Every minor the contract has had: `since` values must name one of these.
RELEASED: tuple[str, ...] = ("1.0", "1.1", "1.2")
MAJOR_PREFIX = "/api/v1"

_VERSION = re.compile(r"^(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})$")


def parse(version: str) -> tuple[int, int]:
    """(major, minor) of ``1.2``; ValueError for anything else."""
    match = _VERSION.match(version)
    if match is None:
        raise ValueError(f"{version!r} is not an ACP version (<major>.<minor>)")
    return int(match.group(1)), int(match.group(2))


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
def newer(since: str, version: str) -> bool:
    """Whether something introduced in ``since`` is unknown to a client speaking ``version``."""
    return parse(since) > parse(version)


def check_operation(version: str, operation: str, since: str) -> None:
    """Refuse an operation newer than the version the client speaks."""
    if newer(since, version):
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
