"""ACP errors (ours) as Zed ACP JSON-RPC errors: the message says what happened and what to
do; ``data`` carries our code, its details and whether a retry may help."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from acp import RequestError

from cleveragents.acp.contract.errors import ACPError, TransportError
from cleveragents.acp.contract.retry import retryable

# JSON-RPC codes of the Zed ACP specification (-32000 authentication, -32002 not found).
_CODES = {
    "INVALID_PARAMS": -32602,
    "NOT_FOUND": -32002,
    "AUTH_REQUIRED": -32000,
    "AUTH_FORBIDDEN": -32000,
}


def as_request_error(exc: ACPError, where: str) -> RequestError:
    if isinstance(exc, TransportError):
        message = f"cannot reach the ACP server at {where}: {exc.message}"
        return RequestError(-32603, message, {"acp_code": exc.code, "retryable": True})
    code = _CODES.get(exc.code, -32603)
    data = {"acp_code": exc.code, "details": exc.details, "retryable": retryable(exc)}
    return RequestError(code, f"{exc.code}: {exc.message}", data)


@contextlib.contextmanager
def translated(where: str) -> Iterator[None]:
    """Raise an ``ACPError`` from the block as the JSON-RPC error the client reads."""
    try:
        yield
    except ACPError as exc:
        raise as_request_error(exc, where) from exc
