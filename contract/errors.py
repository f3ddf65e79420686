"""ACP errors: the one exception type, and the only table of HTTP statuses, gRPC codes and
CLI exit codes.

Domain code raises ``ACPError``; each transport adapter maps it with ``http_status`` or
``grpc_code``, and every client turns the wire form back into the same ``ACPError``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from cleveragents.acp.v1.errors_pb2 import ErrorCode

__all__ = [
    "ERROR_DOMAIN",
    "ACPError",
    "ErrorCode",
    "TransportError",
    "WireMapping",
    "code_name",
    "exit_code",
    "grpc_code",
    "http_status",
    "internal_error",
]

if TYPE_CHECKING:
    import grpc

log = logging.getLogger(__name__)

ERROR_DOMAIN = "acp.cleveragents.dev"


@dataclass(frozen=True)
class WireMapping:
    http_status: int
    # The name of the grpc.StatusCode: every process imports this module, and grpc (a tenth
    # of a local-mode ``agents`` command's start) only those that speak gRPC.
    grpc_status: str
    # The `agents` CLI exits with this (0 is success, 2 a usage error, 12 unreachable).
    exit_code: int

    @property
    def grpc_code(self) -> grpc.StatusCode:
        import grpc

        return grpc.StatusCode[self.grpc_status]


# The nine codes of ADR-026. A test checks the keys against the proto enum.
TABLE: Mapping[str, WireMapping] = MappingProxyType(
    {
        "AUTH_REQUIRED": WireMapping(401, "UNAUTHENTICATED", 3),
        "AUTH_FORBIDDEN": WireMapping(403, "PERMISSION_DENIED", 4),
        "NOT_FOUND": WireMapping(404, "NOT_FOUND", 5),
        "ALREADY_EXISTS": WireMapping(409, "ALREADY_EXISTS", 6),
        "INVALID_PARAMS": WireMapping(422, "INVALID_ARGUMENT", 7),
        "INVALID_STATE": WireMapping(409, "FAILED_PRECONDITION", 8),
        "BUDGET_EXCEEDED": WireMapping(429, "RESOURCE_EXHAUSTED", 9),
        "VERSION_MISMATCH": WireMapping(400, "FAILED_PRECONDITION", 10),
        "INTERNAL_ERROR": WireMapping(500, "INTERNAL", 11),
    }
)


def code_name(code: ErrorCode.ValueType | str) -> str:
    name = code if isinstance(code, str) else ErrorCode.Name(code)
    if name not in TABLE:
        raise ValueError(f"{name!r} is not an ACP error code")
    return name


class ACPError(Exception):
    """An ACP error: a taxonomy code, a message for people, details for programs.

    ``refinement`` names an entity-specific code (``PLAN_NOT_FOUND``); it keeps the
    category's status and travels in ``details["refinement"]``.
    """

    # The gRPC status it arrived with, when a client read it off gRPC (else None).
    grpc_status: str | None = None

    def __init__(
        self,
        code: ErrorCode.ValueType | str,
        message: str,
        details: Mapping[str, Any] | None = None,
        *,
        refinement: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code_name(code)
        self.message = message
        self.details: dict[str, Any] = dict(details or {})
        if refinement is not None:
            self.details["refinement"] = refinement

    def __repr__(self) -> str:
        return f"ACPError({self.code}, {self.message!r}, {self.details!r})"

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ACPError):
            return NotImplemented
        return (self.code, self.message, self.details) == (other.code, other.message, other.details)

    def __hash__(self) -> int:
        return hash((self.code, self.message))


class TransportError(ACPError):
    """The server could not be reached, or the connection was lost: raised by the client
    transports (HTTP and gRPC) so callers test the type, never the message. On the wire
    and to callers that only know ``ACPError`` it is the INTERNAL_ERROR it always was."""

    def __init__(self, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(ErrorCode.INTERNAL_ERROR, message, details)


def internal_error(exc: BaseException, where: str) -> ACPError:
    """An unexpected fault as INTERNAL_ERROR: logged here with its traceback, reported to
    the caller with only a correlation id that finds the log line."""
    # Imported here: every process imports this module, few ever report an internal error.
    from ulid import ULID

    correlation_id = str(ULID())
    log.error("internal error in %s (correlation id %s)", where, correlation_id, exc_info=exc)
    return ACPError(
        ErrorCode.INTERNAL_ERROR,
        f"internal error; correlation id {correlation_id}",
        {"correlation_id": correlation_id},
    )


def http_status(code: str) -> int:
    return TABLE[code].http_status


def grpc_code(code: str) -> grpc.StatusCode:
    return TABLE[code].grpc_code


def exit_code(code: str) -> int:
    return TABLE[code].exit_code
