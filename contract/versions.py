"""ACP versions: each major serves its current minor and the prior minors it still supports
(ADR-026 asks for one; 1.3 keeps both 1.2 and 1.1 served).

A major is one proto package (``cleveragents.acp.v1``) with its own routes prefix
(``/api/v1``) and its own ``VersionTable``, declared here when the major is released;
majors live side by side. ``SUPPORTED`` is newest first. Every operation, field and event
type records the minor that introduced it (``contract/surface.py``), so a client speaking
an older minor sees exactly its surface.

The module-level names (``CURRENT``, ``SUPPORTED``, ``negotiate``...) are those of
``DEFAULT_MAJOR``, the major a request that names no version is served at.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from cleveragents.acp.contract.errors import ACPError, ErrorCode

_VERSION = re.compile(r"^(0|[1-9][0-9]{0,3})\.(0|[1-9][0-9]{0,3})$")
PACKAGE_ROOT = "cleveragents.acp"


def parse(version: str) -> tuple[int, int]:
    """(major, minor) of ``1.2``; ValueError for anything else."""
    match = _VERSION.match(version)
    if match is None:
        raise ValueError(f"{version!r} is not an ACP version (<major>.<minor>)")
    return int(match.group(1)), int(match.group(2))


@functools.cache
def newer(since: str, version: str) -> bool:
    """Whether something introduced in ``since`` is unknown to a client speaking ``version``."""
    return parse(since) > parse(version)


@dataclass(frozen=True)
class VersionTable:
    """The versions of one major: what it serves, what it ever released, where it lives."""

    major: int
    current: str
    # Newest first: the current minor, then the prior minors still served.
    supported: tuple[str, ...]
    # Every minor the major has had: `since` values must name one of these.
    released: tuple[str, ...]

    def __post_init__(self) -> None:
        for version in (self.current, *self.supported, *self.released):
            if parse(version)[0] != self.major:
                raise ValueError(f"ACP {version} is not a version of major {self.major}")
        if self.supported[0] != self.current or not set(self.supported) <= set(self.released):
            raise ValueError(f"major {self.major}: supported versions must start at the current one")

    @property
    def prefix(self) -> str:
        """The routes prefix, ``/api/v1``."""
        return f"/api/v{self.major}"

    @property
    def package(self) -> str:
        """The proto (and gRPC) package, ``cleveragents.acp.v1``."""
        return f"{PACKAGE_ROOT}.v{self.major}"

    def negotiate(self, requested: str | None) -> str:
        """The version a request is served at; absent means the current one."""
        if requested is None or requested == "":
            return self.current
        if requested not in self.supported:
            raise ACPError(
                ErrorCode.VERSION_MISMATCH,
                f"ACP version {requested!r} is not supported; this server speaks {', '.join(self.supported)}",
                {"requested": requested, "supported_versions": list(self.supported)},
            )
        return requested

    def check_operation(self, version: str, operation: str, since: str) -> None:
        """Refuse an operation newer than the version the client speaks."""
        if newer(since, version):
            raise ACPError(
                ErrorCode.VERSION_MISMATCH,
                f"{operation} was introduced in ACP {since}; the request speaks {version}",
                {
                    "operation": operation,
                    "since": since,
                    "requested": version,
                    "supported_versions": list(self.supported),
                },
            )


V1 = VersionTable(
    major=1, current="1.3", supported=("1.3", "1.2", "1.1"), released=("1.0", "1.1", "1.2", "1.3")
)
# The released majors, by number. A proto package `cleveragents.acp.v<N>` is served only
# when its major has a table here (the catalog refuses one that has none).
TABLES: Mapping[int, VersionTable] = MappingProxyType({1: V1})
DEFAULT_MAJOR = 1

_DEFAULT = TABLES[DEFAULT_MAJOR]
CURRENT = _DEFAULT.current
SUPPORTED: tuple[str, ...] = _DEFAULT.supported
RELEASED: tuple[str, ...] = _DEFAULT.released
MAJOR_PREFIX = _DEFAULT.prefix
negotiate = _DEFAULT.negotiate
check_operation = _DEFAULT.check_operation


def major_of(version: str | None, default: int = DEFAULT_MAJOR) -> int:
    """The major a requested version names (``2`` of ``2.0``); ``default`` when it names
    none or is no version at all (negotiation then refuses it with the supported list)."""
    if not version:
        return default
    try:
        return parse(version)[0]
    except ValueError:
        return default
