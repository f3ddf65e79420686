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
caller can fill the store with tickets. Both are counted in the store, so they hold across
the workers of ``agents serve --workers N`` and the replicas over one database: a
principal's by its issued tickets (those expired meanwhile are marked so as they are
counted), the total in one counter record every issue and redemption updates first (on
PostgreSQL its row lock orders them; SQLite has one writer). A total at its cap is recounted
from the tickets at most once per ``SWEEP_SECONDS``.

``issue`` and ``redeem`` are what the event loop awaits: their store work runs on the
store's writer thread (``issue_now`` and ``redeem_now`` are the same, blocking their thread).
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import orjson

from cleveragents.acp.contract.call import CallContext, Principal, Role
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.events.log import check_event_types
from cleveragents.acp.facade.store.base import (
    ListQuery,
    Record,
    StaleRevisionError,
    Store,
    StoreConflictError,
)
from cleveragents.acp.v1 import events_pb2

KIND = "stream_ticket"
TICKET_PREFIX = "acpt_"
TTL_SECONDS = 30.0
MAX_TTL_SECONDS = 60.0
STREAM_OPERATION = "events.subscribe"
_ISSUED, _USED, _EXPIRED = "issued", "used", "expired"
# The record counting issued tickets of every principal (its body: count, last recount).
COUNTER_KIND, COUNTER_ID = "stream_ticket_count", "outstanding"
# A total at its cap is recounted at most this often (the recount reads every issued ticket).
SWEEP_SECONDS = 1.0
# Issued tickets read per page when counting them.
_PAGE = 256
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

    async def issue(
        self, ctx: CallContext, request: events_pb2.CreateStreamTicketRequest
    ) -> events_pb2.CreateStreamTicketResponse:
        """``issue_now`` on the store's writer thread."""
        return _answer(await self._store.write(lambda _store: self._issue(ctx, request)))

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
        return _answer(self._issue(ctx, request))

    def _issue(
        self, ctx: CallContext, request: events_pb2.CreateStreamTicketRequest
    ) -> events_pb2.CreateStreamTicketResponse | ACPError:
        """The ticket, or the refusal past a cap (returned, not raised: the expired tickets
        marked while counting stay marked when the transaction commits)."""
        principal = ctx.require_principal()
        ctx.visible_namespaces(request.namespace)
        check_event_types(list(request.event_type))
        now = self._clock()
        ticket = TICKET_PREFIX + secrets.token_urlsafe(32)
        key = digest(ticket)
        expires = now + self.ttl_seconds
        with self._store.transaction():
            outstanding = _Outstanding.lock(self._store)
            self._prune(now, outstanding)
            refusal = self._hold(principal.name, now, outstanding)
            if refusal is None:
                outstanding.count += 1
                self._insert(request, principal, key, now, expires)
            outstanding.save(self._store, now)
        if refusal is not None:
            return refusal
        response = events_pb2.CreateStreamTicketResponse(ticket=ticket)
        response.expire_time.FromNanoseconds(int(expires * 1e9))
        return response

    def _hold(self, name: str, now: float, outstanding: _Outstanding) -> ACPError | None:
        """None when ``name`` may have one more ticket, else the refusal."""
        held = len(self._live(self._issued(name), now, outstanding))
        if held >= MAX_PER_PRINCIPAL:
            return self._too_many(f"principal {name!r} holds", held, MAX_PER_PRINCIPAL)
        if outstanding.count >= MAX_OUTSTANDING and now - outstanding.swept >= SWEEP_SECONDS:
            outstanding.count = len(self._live(self._issued(None), now, outstanding))
            outstanding.swept = now
        if outstanding.count >= MAX_OUTSTANDING:
            return self._too_many("the server holds", outstanding.count, MAX_OUTSTANDING)
        return None

    def _too_many(self, whose: str, count: int, cap: int) -> ACPError:
        return ACPError(
            ErrorCode.BUDGET_EXCEEDED,
            f"{whose} {count} unused stream tickets, the most allowed; use one or "
            f"let one expire (they live {self.ttl_seconds:g} s)",
            {"max_tickets": cap, "retry_after_seconds": self.ttl_seconds},
            refinement="TOO_MANY_TICKETS",
        )

    def _issued(self, name: str | None) -> list[Record]:
        """Every issued ticket of ``name`` (None: of everyone), page by page."""
        found: list[Record] = []
        before: str | None = None
        while True:
            page = self._store.query(
                ListQuery(
                    kind=KIND,
                    state=_ISSUED,
                    attrs={} if name is None else {"principal": name},
                    before_id=before,
                    limit=_PAGE,
                )
            )
            found.extend(page)
            if len(page) < _PAGE:
                return found
            before = page[-1].id

    def _live(self, issued: list[Record], now: float, outstanding: _Outstanding) -> list[Record]:
        """The tickets not expired; the others are marked expired and counted out."""
        live = []
        for record in issued:
            if now < float(record.attrs.get("expires", "0")):
                live.append(record)
                continue
            self._store.update(
                dataclasses.replace(record, state=_EXPIRED, revision=record.revision + 1, update_time=now),
                expected_revision=record.revision,
            )
            outstanding.count -= 1
        return live

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
        """Use the ticket up (an expired one too: ``_admitted`` says so), counting it out."""
        with self._store.transaction():
            # The counter first: on PostgreSQL its row lock orders this with every issue.
            outstanding = _Outstanding.lock(self._store)
            record = self._store.get(KIND, key)
            if record is None:
                raise _refused("TICKET_UNKNOWN", "unknown stream ticket; ask events.ticket for one")
            if record.state not in (_ISSUED, _EXPIRED):
                raise _used()
            used = dataclasses.replace(record, state=_USED, revision=record.revision + 1, update_time=now)
            try:
                self._store.update(used, expected_revision=record.revision)
            except StaleRevisionError:
                raise _used() from None
            if record.state == _ISSUED:
                outstanding.count -= 1
                outstanding.save(self._store, now)
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
                f"principal {name!r} of the stream ticket is no longer known (revoked, removed or expired)",
                principal=name,
            )
        return principal

    def _prune(self, now: float, outstanding: _Outstanding) -> None:
        """Remove the records of tickets expired ``PRUNE_SECONDS`` ago (at most once per
        interval in this process); those never presented nor marked are counted out."""
        if now - self._pruned < PRUNE_SECONDS:
            return
        self._pruned = now
        limit = now - PRUNE_SECONDS
        for record in self._store.iter_kind(KIND):
            if float(record.attrs.get("expires", "0")) < limit:
                self._store.delete(KIND, record.id)
                if record.state == _ISSUED:
                    outstanding.count -= 1


def _answer(
    outcome: events_pb2.CreateStreamTicketResponse | ACPError,
) -> events_pb2.CreateStreamTicketResponse:
    if isinstance(outcome, ACPError):
        raise outcome
    return outcome


@dataclasses.dataclass
class _Outstanding:
    """The store's count of issued tickets, read in the write transaction that changes it."""

    record: Record
    count: int
    # When the count was last recounted from the tickets (on the issuer's clock).
    swept: float

    @classmethod
    def lock(cls, store: Store) -> _Outstanding:
        """The counter, created on first use (on PostgreSQL the read locks its row until
        the transaction ends; another process creating it first is fine)."""
        record = store.get(COUNTER_KIND, COUNTER_ID)
        if record is None:
            record = Record(kind=COUNTER_KIND, id=COUNTER_ID, namespace="", body=b"{}")
            try:
                store.insert(record)
            except StoreConflictError:
                found = store.get(COUNTER_KIND, COUNTER_ID)
                if found is None:
                    raise
                record = found
        state = orjson.loads(record.body or b"{}")
        return cls(record, int(state.get("count", 0)), float(state.get("swept", 0.0)))

    def save(self, store: Store, now: float) -> None:
        """Write the count back (nothing when it did not change)."""
        body = orjson.dumps({"count": max(self.count, 0), "swept": self.swept})
        if body == self.record.body:
            return
        saved = dataclasses.replace(
            self.record, body=body, revision=self.record.revision + 1, update_time=now
        )
        store.update(saved, expected_revision=self.record.revision)
        self.record = saved
