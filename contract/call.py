"""What a call carries below the transports: credentials, version, request id, principal.

Every transport builds a ``CallContext`` and hands it to ``ServiceFacade.invoke``; the
version, authentication and namespace checks happen there and in the domain services,
once, so no wire can skip them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

from cleveragents.acp.contract.errors import ACPError, ErrorCode

DEFAULT_NAMESPACE = "default"


class Role(enum.StrEnum):
    """What a principal may do (docs/security.md): a reader calls the read-only operations,
    a writer every operation but those that make the server run a process, an admin all."""

    READER = "reader"
    WRITER = "writer"
    ADMIN = "admin"


@dataclass(frozen=True)
class Principal:
    """Who is calling, which namespaces it may use (``None``: all of them) and its role."""

    name: str
    namespaces: frozenset[str] | None
    role: Role = Role.WRITER

    def may_use(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces


def ambiguous_credentials(what: str) -> ACPError:
    """Two credentials on one call (two Authorization headers, a header and ``auth.token``,
    a token and a stream ticket): refused on every wire alike, never one picked."""
    return ACPError(
        ErrorCode.AUTH_REQUIRED,
        f"give exactly one credential, not {what}",
        {"scheme": "Bearer"},
        refinement="AMBIGUOUS_CREDENTIALS",
    )


# In local mode the user is the operator.
LOCAL_PRINCIPAL = Principal("local", None, Role.ADMIN)


@dataclass(slots=True)
class Reply:
    """What an answer says besides its message. The service fills it in; the client
    transports fill it in from the wire (``ACP-Replayed`` header, ``acp-replayed`` trailer),
    so a caller passing ``CallOptions(reply=Reply())`` reads it on every transport."""

    # The answer is the stored one of an earlier call with the same request id (docs/idempotency.md).
    replayed: bool = False


@dataclass(slots=True)
class CallContext:
    token: str | None = None
    acp_version: str | None = None
    # A stream ticket (events.ticket) presented instead of a token; secret, like it.
    ticket: str | None = None
    request_id: str = ""
    # Whether the caller chose the request id (else the server made one up): only a chosen
    # id makes a mutating call idempotent (docs/idempotency.md).
    request_id_given: bool = False
    # Filled by the facade once the token is verified (or local mode skips auth).
    principal: Principal | None = None
    # The version the call is served at, after negotiation.
    served_version: str = field(default="")
    # Which wire brought the call (a bounded set: metrics label it): local, envelope, rest, grpc.
    transport: str = "local"
    # The caller's W3C trace context, continued by the server's spans, logs and events.
    traceparent: str | None = None
    # What the answer says besides its message; the facade creates it when there is something to say.
    reply: Reply | None = None
    # The revision the caller read of the one session or plan the call mutates (ACP 1.3:
    # the envelope's ``if_revision``, gRPC ``acp-if-revision``, HTTP ``If-Match``); checked
    # in the mutation's own write transaction (facade/domain/revisions.py).
    if_revision: int | None = None

    @property
    def replayed(self) -> bool:
        return self.reply is not None and self.reply.replayed

    def authorize(self, namespace: str) -> None:
        """Refuse an entity or namespace outside the principal's namespaces."""
        principal = self.require_principal()
        if not principal.may_use(namespace):
            raise ACPError(
                ErrorCode.AUTH_FORBIDDEN,
                f"principal {principal.name!r} may not use namespace {namespace!r}",
                {"namespace": namespace, "principal": principal.name},
            )

    def may_see(self, namespace: str) -> bool:
        """Whether an entity the caller found by id lies in a namespace it may use. One it may
        not use answers as an unknown id does (NOT_FOUND), so ids tell nothing of other
        namespaces; a namespace the caller names itself is refused by ``authorize``."""
        return self.require_principal().may_use(namespace)

    def namespace(self, requested: str) -> str:
        """The namespace a request names (default ``default``), once authorized."""
        namespace = requested or DEFAULT_NAMESPACE
        self.authorize(namespace)
        return namespace

    def visible_namespaces(self, requested: str = "") -> frozenset[str] | None:
        """Namespaces a list may show: the requested one, or all permitted (None: all)."""
        if requested:
            self.authorize(requested)
            return frozenset({requested})
        return self.require_principal().namespaces

    def require_principal(self) -> Principal:
        if self.principal is None:
            raise ACPError(ErrorCode.INTERNAL_ERROR, "call reached the domain without a principal")
        return self.principal

    def visible(self, namespaces: Iterable[str]) -> list[str]:
        principal = self.require_principal()
        return [ns for ns in namespaces if principal.may_use(ns)]
