"""Stream tickets (domain): how a browser's ``EventSource``, which cannot send an Authorization
header, opens an event stream without a token in its URL.

``events.ticket``, called with the token, issues a random ticket bound to the caller's
principal and to the exact filters of one stream; ``GET /api/v1/events/stream?ticket=...``
presents it instead of the token. A ticket lives ``TTL_SECONDS`` (at most 60) and opens
one stream: the first presentation uses it up, whatever its outcome.

The store keeps only the ticket's SHA-256, with its principal, filters and expiry, so a
ticket works against any process or replica over the same database, and "used" is one
atomic update there (two replicas presented the same ticket at once: one wins). At
redemption the principal is looked up again, so a principal removed (revoked) since the
ticket was issued is refused, and its namespaces are the current ones.

Outstanding tickets (issued, not yet presented, not expired) are capped per principal
(``MAX_PER_PRINCIPAL``) and in all (``MAX_OUTSTANDING``): a caller asking past the cap gets
BUDGET_EXCEEDED (``TOO_MANY_TICKETS``) until one of its tickets is used or expires, so no
caller can fill the store with tickets. The count is kept by the process that issued them.

``issue`` and ``redeem`` are what the event loop awaits: their store work runs on the
store's writer thread (``issue_now`` and ``redeem_now`` are the same, blocking their thread).
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import orjson

from cleveragents.acp.contract.call import CallContext, Principal, Role
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.events import check_event_types
from cleveragents.acp.facade.store.base import Record, StaleRevisionError, Store
from cleveragents.acp.v1 import events_pb2

KIND = "stream_ticket"
TICKET_PREFIX = "acpt_"
TTL_SECONDS = 30.0
MAX_TTL_SECONDS = 60.0
STREAM_OPERATION = "events.subscribe"
_ISSUED, _USED = "issued", "used"
# Records of tickets expired this long ago are removed, at most once per interval.
PRUNE_SECONDS = 60.0
# Outstanding tickets one principal may hold, and all principals together.
MAX_PER_PRINCIPAL = 32
MAX_OUTSTANDING = 4096


@runtime_checkable
class PrincipalLookup(Protocol):
    """Who a principal is now (None: no longer known: removed, revoked)."""

    def principal_named(self, name: str) -> Principal | None: ...


def _refused(refinement: str, message: str, **details: object) -> ACPError:
    return ACPError(
        ErrorCode.AUTH_REQUIRED,
        message,
        {"scheme": "Ticket", **details},
        refinement=refinement,
    )


def filters_of(
    *, plan_id: str, session_id: str, namespace: str, event_types: Sequence[str]
) -> dict[str, object]:
    return {
        "plan_id": plan_id,
        "session_id": session_id,
        "namespace": namespace,
        "event_type": sorted(set(event_types)),
    }


Filtered = events_pb2.SubscribeEventsRequest | events_pb2.CreateStreamTicketRequest


def _filters_of(request: Filtered) -> dict[str, object]:
    return filters_of(
        plan_id=request.plan_id,
        session_id=request.session_id,
        namespace=request.namespace,
        event_types=list(request.event_type),
    )


def _namespaces_text(namespaces: frozenset[str] | None) -> str:
    return "*" if namespaces is None else ",".join(sorted(namespaces))


def _namespaces(text: str) -> frozenset[str] | None:
    return None if text == "*" else frozenset(filter(None, text.split(",")))


def _used() -> ACPError:
    return _refused("TICKET_USED", "the stream ticket was already used; ask events.ticket for a new one")


def digest(ticket: str) -> str:
    return hashlib.sha256(ticket.encode()).hexdigest()


def _key(ticket: str) -> str:
    """The stored key of a ticket of the right form; TICKET_UNKNOWN for any other."""
    if not ticket.startswith(TICKET_PREFIX) or len(ticket) > 128:
        raise _refused("TICKET_UNKNOWN", "unknown stream ticket; ask events.ticket for one")
    return digest(ticket)


class StreamTickets:
    def __init__(
        self,
        store: Store,
        principals: PrincipalLookup | None,
        *,
        ttl_seconds: float = TTL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0 < ttl_seconds <= MAX_TTL_SECONDS:
            raise ValueError(f"a ticket lives between 0 and {MAX_TTL_SECONDS} seconds")
        self._store = store
        self._principals = principals
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self._pruned = -PRUNE_SECONDS
        # Outstanding tickets this process issued: principal -> ticket digest -> expiry.
        self._outstanding: dict[str, dict[str, float]] = {}
        self._count = 0
        self._lock = threading.Lock()

    async def issue(
        self, ctx: CallContext, request: events_pb2.CreateStreamTicketRequest
    ) -> events_pb2.CreateStreamTicketResponse:
        """``issue_now`` on the store's writer thread."""
        return await self._store.write(lambda _store: self.issue_now(ctx, request))

    async def redeem(self, ticket: str, operation: str, request: object) -> Principal:
        """``redeem_now``, using the ticket up on the store's writer thread."""
        key = _key(ticket)
        now = self._clock()
        record = await self._store.write(lambda _store: self._use(key, now))
        return self._admitted(record, key, now, operation, request)

    def issue_now(
        self, ctx: CallContext, request: events_pb2.CreateStreamTicketRequest
    ) -> events_pb2.CreateStreamTicketResponse:
        """A ticket for the stream ``request`` describes, once its filters would be admitted."""
        principal = ctx.require_principal()
        ctx.visible_namespaces(request.namespace)
        check_event_types(list(request.event_type))
        now = self._clock()
        self._prune(now)
        ticket = TICKET_PREFIX + secrets.token_urlsafe(32)
        key = digest(ticket)
        expires = now + self.ttl_seconds
        self._hold(principal.name, key, expires, now)
        try:
            self._insert(request, principal, key, now, expires)
        except BaseException:
            self._release(principal.name, key)
            raise
        response = events_pb2.CreateStreamTicketResponse(ticket=ticket)
        response.expire_time.FromNanoseconds(int(expires * 1e9))
        return response

    def _hold(self, name: str, key: str, expires: float, now: float) -> None:
        """Count a new ticket of ``name``, or refuse it past a cap (expired ones go first)."""
        with self._lock:
            if len(self._outstanding.get(name, ())) >= MAX_PER_PRINCIPAL:
                self._drop_expired(name, now)
            if self._count >= MAX_OUTSTANDING:
                for other in list(self._outstanding):
                    self._drop_expired(other, now)
            for count, cap, whose in (
                (len(self._outstanding.get(name, ())), MAX_PER_PRINCIPAL, f"principal {name!r} holds"),
                (self._count, MAX_OUTSTANDING, "the server holds"),
            ):
                if count >= cap:
                    raise ACPError(
                        ErrorCode.BUDGET_EXCEEDED,
                        f"{whose} {count} unused stream tickets, the most allowed; use one or "
                        f"let one expire (they live {self.ttl_seconds:g} s)",
                        {"max_tickets": cap, "retry_after_seconds": self.ttl_seconds},
                        refinement="TOO_MANY_TICKETS",
                    )
            self._outstanding.setdefault(name, {})[key] = expires
            self._count += 1

    def _drop_expired(self, name: str, now: float) -> None:
        held = self._outstanding[name]
        for key in [key for key, expires in held.items() if expires <= now]:
            del held[key]
            self._count -= 1
        if not held:
            del self._outstanding[name]

    def _release(self, name: str, key: str) -> None:
        """The ticket is no longer outstanding (presented, or never stored)."""
        with self._lock:
            held = self._outstanding.get(name)
            if held is not None and held.pop(key, None) is not None:
                self._count -= 1
                if not held:
                    del self._outstanding[name]

    def _insert(
        self,
        request: events_pb2.CreateStreamTicketRequest,
        principal: Principal,
        key: str,
        now: float,
        expires: float,
    ) -> None:
        self._store.insert(
            Record(
                kind=KIND,
                id=key,
                namespace=request.namespace,
                body=b"",
                state=_ISSUED,
                attrs={
                    "principal": principal.name,
                    "namespaces": _namespaces_text(principal.namespaces),
                    "role": str(principal.role),
                    "operation": STREAM_OPERATION,
                    "filters": orjson.dumps(_filters_of(request)).decode(),
                    "expires": repr(expires),
                },
                create_time=now,
                update_time=now,
            )
        )

    def redeem_now(self, ticket: str, operation: str, request: object) -> Principal:
        """The principal a ticket opens ``request`` for, using the ticket up; AUTH_REQUIRED
        with a refinement when it cannot (unknown, used, expired, another operation or
        other filters, its principal gone)."""
        key = _key(ticket)
        now = self._clock()
        return self._admitted(self._use(key, now), key, now, operation, request)

    def _admitted(self, record: Record, key: str, now: float, operation: str, request: object) -> Principal:
        attrs = record.attrs
        self._release(attrs.get("principal", ""), key)
        if now >= float(attrs.get("expires", "0")):
            raise _refused("TICKET_EXPIRED", "the stream ticket expired; ask events.ticket for a new one")
        if operation != attrs.get("operation") or not isinstance(request, events_pb2.SubscribeEventsRequest):
            raise _refused(
                "TICKET_WRONG_OPERATION",
                f"a stream ticket opens {attrs.get('operation')} only, not {operation}",
                operation=operation,
            )
        issued = orjson.loads(attrs.get("filters", "{}"))
        asked = _filters_of(request)
        differ = sorted(key for key in asked if asked[key] != issued.get(key))
        if differ:
            raise _refused(
                "TICKET_FILTERS_DIFFER",
                f"the stream asks for other {', '.join(differ)} than the ticket was issued for",
                fields=differ,
            )
        return self._principal(attrs)

    def _use(self, key: str, now: float) -> Record:
        with self._store.transaction():
            record = self._store.get(KIND, key)
            if record is None:
                raise _refused("TICKET_UNKNOWN", "unknown stream ticket; ask events.ticket for one")
            if record.state != _ISSUED:
                raise _used()
            used = dataclasses.replace(record, state=_USED, revision=record.revision + 1, update_time=now)
            try:
                self._store.update(used, expected_revision=record.revision)
            except StaleRevisionError:
                raise _used() from None
        return record

    def _principal(self, attrs: dict[str, str]) -> Principal:
        """The ticket's principal as it is now when principals can be looked up (local
        mode, or an authenticator that cannot: as it was when the ticket was issued)."""
        name = attrs.get("principal", "")
        if self._principals is None:
            return Principal(
                name, _namespaces(attrs.get("namespaces", "")), Role(attrs.get("role", Role.READER))
            )
        principal = self._principals.principal_named(name)
        if principal is None:
            raise _refused(
                "PRINCIPAL_REVOKED",
                f"principal {name!r} of the stream ticket is no longer known (revoked or removed)",
                principal=name,
            )
        return principal

    def _prune(self, now: float) -> None:
        if now - self._pruned < PRUNE_SECONDS:
            return
        self._pruned = now
        limit = now - PRUNE_SECONDS
        with self._store.transaction():
            stale = [r.id for r in self._store.iter_kind(KIND) if float(r.attrs.get("expires", "0")) < limit]
            for key in stale:
                self._store.delete(KIND, key)
