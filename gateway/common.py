"""What the HTTP and gRPC front ends read from a request the same way: token, version, id.

Reading is all they do here: the checks themselves run once, in the facade.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import Sequence

from cleveragents.acp.contract import limits, versions
from cleveragents.acp.contract.call import ambiguous_credentials
from cleveragents.acp.contract.envelope import new_request_id
from cleveragents.acp.contract.errors import ACPError, ErrorCode

REQUEST_ID_HEADER = "x-request-id"
# The IETF draft's name for the same thing over HTTP (an alias of X-Request-ID).
IDEMPOTENCY_KEY_HEADER = "idempotency-key"
# Set on an answer that is the stored one of an earlier call with the same request id:
# an HTTP header, a gRPC trailing-metadata entry (docs/idempotency.md).
REPLAYED_HEADER = "acp-replayed"
VERSION_HEADER = "acp-version"
# Printable ASCII without spaces, so an id travels unchanged in HTTP headers and gRPC metadata.
_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,128}$")


def single_bearer(values: Sequence[str]) -> str | None:
    """The token of the one ``Authorization`` value a request carries; two of them are
    AMBIGUOUS_CREDENTIALS (HTTP and gRPC used to take different ones)."""
    if len(values) > 1:
        raise authorizations(len(values))
    return bearer_token(values[0] if values else None)


def authorizations(count: int) -> ACPError:
    """AMBIGUOUS_CREDENTIALS for ``count`` Authorization values on one request."""
    return ambiguous_credentials(f"{count} Authorization values")


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value; None for any other form."""
    if not authorization:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        return None
    return token


def request_id(value: str | None) -> str:
    """The caller's request id, or a fresh ULID when it sent none."""
    if value is None or value == "":
        return new_request_id()
    if not _REQUEST_ID.match(value):
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            "request_id must be 1-128 printable ASCII characters without spaces",
            {"field": "request_id"},
        )
    return value


def given_request_id(header: str | None, idempotency_key: str | None) -> str | None:
    """The request id an HTTP caller chose: ``X-Request-ID`` or its alias ``Idempotency-Key``
    (both given must agree), validated; None when it chose none."""
    if header and idempotency_key and header != idempotency_key:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            "X-Request-ID and Idempotency-Key name the same thing; give one, or the same value in both",
            {"field": "request_id"},
            refinement="REQUEST_ID_CONFLICT",
        )
    given = header or idempotency_key
    return request_id(given) if given else None


def served_version(requested: str | None, table: versions.VersionTable = versions.V1) -> str:
    """The version a response is labelled with: the requested one when ``table``'s major
    speaks it, else that major's current one."""
    try:
        return table.negotiate(requested)
    except ACPError:
        return table.current


# The places for requests past the body limit (session.imports) of each event loop: one per
# process, shared by its HTTP and gRPC servers, held from reading the request to its answer.
# Eight 28 MiB imports at once took a server to 3.1-3.5 GiB; each holds ~400 MiB meanwhile.
_LARGE_REQUESTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


def large_requests() -> asyncio.Semaphore:
    """The running loop's places for large requests (``limits.MAX_LARGE_BODIES``)."""
    loop = asyncio.get_running_loop()
    places = _LARGE_REQUESTS.get(loop)
    if places is None:
        places = _LARGE_REQUESTS[loop] = asyncio.Semaphore(limits.MAX_LARGE_BODIES)
    return places
