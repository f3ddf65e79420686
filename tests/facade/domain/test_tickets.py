"""Stream tickets (events.ticket): issued with a token, redeemed once below every
transport, over real SQLite files; two stores over one file stand for two replicas."""

from __future__ import annotations

import asyncio
import logging
import pathlib
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest

from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract import catalog, envelope
from cleveragents.acp.contract.call import CallContext, Principal
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.contract.transport import CallOptions
from cleveragents.acp.facade import auth
from cleveragents.acp.facade.domain.events.tickets import KIND, PRUNE_SECONDS, StreamTickets
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import events_pb2, session_pb2
from tests.security.test_credentials import STREAM_GUARD_SECONDS, expire, narrow

SUBSCRIBE = catalog.OPERATIONS["events.subscribe"]
TICKET = catalog.OPERATIONS["events.ticket"]
ALICE = Principal("alice", frozenset({"default"}))


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Principals:
    def __init__(self, *known: Principal) -> None:
        self.known = {p.name: p for p in known}

    def principal_named(self, name: str) -> Principal | None:
        return self.known.get(name)


@pytest.fixture
def store(db_path: pathlib.Path) -> Iterator[SQLiteStore]:
    store = SQLiteStore(db_path)
    yield store
    store.close()


@dataclass
class Setup:
    tickets: StreamTickets
    clock: Clock
    principals: Principals


@pytest.fixture
def setup(store: SQLiteStore) -> Setup:
    clock, principals = Clock(), Principals(ALICE)
    return Setup(StreamTickets(store, principals, clock=clock), clock, principals)


def ctx(principal: Principal = ALICE) -> CallContext:
    return CallContext(principal=principal)


def issue(setup: Setup, **filters: object) -> str:
    return setup.tickets.issue_now(ctx(), events_pb2.CreateStreamTicketRequest(**filters)).ticket  # type: ignore[arg-type]


def refusal(setup: Setup, ticket: str, request: object, operation: str = "events.subscribe") -> str:
    with pytest.raises(ACPError) as caught:
        setup.tickets.redeem_now(ticket, operation, request)
    assert caught.value.code == "AUTH_REQUIRED"
    assert ticket not in str(caught.value.details)
    assert ticket not in caught.value.message
    return str(caught.value.details["refinement"])


def test_a_ticket_opens_its_stream_once(setup: Setup) -> None:
    ticket = issue(setup, plan_id="p1", event_type=["plan.created", "tool.invoked", "plan.created"])
    assert ticket.startswith("acpt_")
    assert len(ticket) > 40
    request = events_pb2.SubscribeEventsRequest(
        plan_id="p1", event_type=["tool.invoked", "plan.created"], after_sequence=41
    )
    assert setup.tickets.redeem_now(ticket, "events.subscribe", request) == ALICE
    assert refusal(setup, ticket, request) == "TICKET_USED"


def test_the_expiry_is_at_most_a_minute_and_holds(setup: Setup) -> None:
    response = setup.tickets.issue_now(ctx(), events_pb2.CreateStreamTicketRequest())
    assert response.expire_time.ToNanoseconds() / 1e9 == pytest.approx(setup.clock.now + 30.0)
    setup.clock.now += 30.0
    assert refusal(setup, response.ticket, events_pb2.SubscribeEventsRequest()) == "TICKET_EXPIRED"
    with pytest.raises(ValueError, match="60"):
        StreamTickets(setup.tickets._store, None, ttl_seconds=61)


@pytest.mark.parametrize(
    ("asked", "field"),
    [
        ({"plan_id": "p2"}, "plan_id"),
        ({"plan_id": "p1", "session_id": "s1"}, "session_id"),
        ({"plan_id": "p1", "namespace": "default"}, "namespace"),
        ({"plan_id": "p1", "event_type": ["plan.created"]}, "event_type"),
        ({}, "plan_id"),
    ],
)
def test_other_filters_are_refused_and_use_the_ticket_up(
    setup: Setup, asked: dict[str, object], field: str
) -> None:
    ticket = issue(setup, plan_id="p1")
    with pytest.raises(ACPError) as caught:
        setup.tickets.redeem_now(ticket, "events.subscribe", events_pb2.SubscribeEventsRequest(**asked))  # type: ignore[arg-type]
    assert caught.value.details["refinement"] == "TICKET_FILTERS_DIFFER"
    assert caught.value.details["fields"] == [field]
    assert refusal(setup, ticket, events_pb2.SubscribeEventsRequest(plan_id="p1")) == "TICKET_USED"


def test_unknown_malformed_and_misused_tickets_are_refused(setup: Setup) -> None:
    request = events_pb2.SubscribeEventsRequest()
    assert refusal(setup, "acpt_" + "x" * 43, request) == "TICKET_UNKNOWN"
    assert refusal(setup, "acp_a-bearer-token", request) == "TICKET_UNKNOWN"
    assert refusal(setup, "acpt_" + "x" * 500, request) == "TICKET_UNKNOWN"
    ticket = issue(setup)
    other = events_pb2.CreateStreamTicketRequest()
    assert refusal(setup, ticket, other, operation="events.ticket") == "TICKET_WRONG_OPERATION"


def test_a_revoked_principal_cannot_use_its_ticket(setup: Setup) -> None:
    ticket = issue(setup)
    del setup.principals.known["alice"]
    assert refusal(setup, ticket, events_pb2.SubscribeEventsRequest()) == "PRINCIPAL_REVOKED"


def test_the_principal_is_looked_up_again_at_redemption(setup: Setup) -> None:
    ticket = issue(setup)
    narrower = Principal("alice", frozenset({"team"}))
    setup.principals.known["alice"] = narrower
    assert (
        setup.tickets.redeem_now(ticket, "events.subscribe", events_pb2.SubscribeEventsRequest()) == narrower
    )


def test_without_a_lookup_the_ticket_keeps_the_principal_it_was_issued_to(store: SQLiteStore) -> None:
    tickets = StreamTickets(store, None)
    for principal in (ALICE, Principal("root", None)):
        ticket = tickets.issue_now(ctx(principal), events_pb2.CreateStreamTicketRequest()).ticket
        assert (
            tickets.redeem_now(ticket, "events.subscribe", events_pb2.SubscribeEventsRequest()) == principal
        )


def test_issuing_checks_what_the_stream_would(setup: Setup) -> None:
    with pytest.raises(ACPError) as forbidden:
        issue(setup, namespace="other")
    assert forbidden.value.code == "AUTH_FORBIDDEN"
    with pytest.raises(ACPError) as unknown:
        issue(setup, event_type=["plan.nope"])
    assert (unknown.value.code, unknown.value.details["field"]) == ("INVALID_PARAMS", "event_type")


def test_the_store_keeps_a_digest_never_the_ticket(setup: Setup, store: SQLiteStore) -> None:
    ticket = issue(setup, plan_id="p1")
    (record,) = list(store.iter_kind(KIND))
    assert ticket not in repr(record)
    assert record.attrs["principal"] == "alice"


def test_expired_tickets_are_pruned(setup: Setup, store: SQLiteStore) -> None:
    for _ in range(3):
        issue(setup)
    setup.clock.now += PRUNE_SECONDS * 2 + 31
    issue(setup)
    assert len(list(store.iter_kind(KIND))) == 1


def test_another_replica_over_the_database_redeems_it_and_only_one_wins(
    setup: Setup, db_path: pathlib.Path
) -> None:
    replicas = [SQLiteStore(db_path) for _ in range(4)]
    try:
        ticket = issue(setup, session_id="s1")
        request = events_pb2.SubscribeEventsRequest(session_id="s1")
        start = threading.Barrier(len(replicas))
        outcomes: list[str] = []

        def redeem(store: SQLiteStore) -> None:
            tickets = StreamTickets(store, setup.principals, clock=setup.clock)
            start.wait(10)
            try:
                outcomes.append(tickets.redeem_now(ticket, "events.subscribe", request).name)
            except ACPError as err:
                outcomes.append(str(err.details["refinement"]))

        threads = [threading.Thread(target=redeem, args=(store,)) for store in replicas]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert sorted(outcomes) == ["TICKET_USED"] * 3 + ["alice"]
    finally:
        for store in replicas:
            store.close()


# through the facade, as every transport reaches it -------------------------------------


@dataclass
class Served:
    facade: ServiceFacade
    transport: LocalTransport
    tokens: dict[str, str]
    path: pathlib.Path


@pytest.fixture
async def served(tmp_path: pathlib.Path) -> AsyncIterator[Served]:
    path = tmp_path / "tokens.toml"
    tokens = {name: auth.create_token(path, name, [name]) for name in ("alice", "bob")}
    facade = open_facade(tmp_path / "acp.db", authenticator=auth.TokenAuthenticator(path, check_seconds=0))
    yield Served(facade, LocalTransport(facade), tokens, path)
    await facade.close()


def options(token: str | None = None, ticket: str | None = None, version: str | None = None) -> CallOptions:
    """A fresh request id per call: one id is one call (docs/idempotency.md)."""
    return CallOptions(acp_version=version, token=token, request_id=envelope.new_request_id(), ticket=ticket)


async def test_a_ticket_streams_as_its_principal_through_the_facade(
    served: Served, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    alice = served.tokens["alice"]
    created = await served.transport.call(
        catalog.OPERATIONS["session.create"],
        session_pb2.CreateSessionRequest(namespace="alice"),
        options(alice),
    )
    session_id = created.session.meta.id  # type: ignore[attr-defined]
    issued = await served.transport.call(
        TICKET, events_pb2.CreateStreamTicketRequest(session_id=session_id), options(alice)
    )
    ticket = issued.ticket  # type: ignore[attr-defined]
    request = events_pb2.SubscribeEventsRequest(session_id=session_id)
    items = await served.transport.open_stream(SUBSCRIBE, request, options(ticket=ticket))
    await served.transport.call(
        catalog.OPERATIONS["session.tell"],
        session_pb2.TellSessionRequest(session_id=session_id, content="hello"),
        options(alice),
    )
    first = await anext(items)
    assert first.event.session_id == session_id  # type: ignore[attr-defined]
    await items.aclose()  # type: ignore[attr-defined]
    with pytest.raises(ACPError) as reused:
        await served.transport.open_stream(SUBSCRIBE, request, options(ticket=ticket))
    assert reused.value.details["refinement"] == "TICKET_USED"
    assert all(ticket not in record.getMessage() for record in caplog.records)


async def test_a_ticket_is_no_token_and_no_token_goes_with_it(served: Served) -> None:
    alice = served.tokens["alice"]
    ticket = (
        await served.transport.call(TICKET, events_pb2.CreateStreamTicketRequest(), options(alice))
    ).ticket  # type: ignore[attr-defined]
    with pytest.raises(ACPError) as both:
        await served.transport.open_stream(
            SUBSCRIBE, events_pb2.SubscribeEventsRequest(), options(alice, ticket)
        )
    assert (both.value.code, both.value.details["refinement"]) == ("AUTH_REQUIRED", "AMBIGUOUS_CREDENTIALS")
    with pytest.raises(ACPError) as as_token:
        await served.transport.call(
            catalog.OPERATIONS["session.list"], session_pb2.ListSessionsRequest(), options(ticket)
        )
    assert as_token.value.code == "AUTH_REQUIRED"
    ticket = (
        await served.transport.call(TICKET, events_pb2.CreateStreamTicketRequest(), options(alice))
    ).ticket  # type: ignore[attr-defined]
    with pytest.raises(ACPError) as unary:
        await served.transport.call(
            catalog.OPERATIONS["session.list"], session_pb2.ListSessionsRequest(), options(ticket=ticket)
        )
    assert unary.value.details["refinement"] == "TICKET_WRONG_OPERATION"


async def test_a_removed_principal_is_refused_at_redemption(served: Served) -> None:
    bob = served.tokens["bob"]
    ticket = (
        await served.transport.call(TICKET, events_pb2.CreateStreamTicketRequest(), options(bob))
    ).ticket  # type: ignore[attr-defined]
    auth.write(served.path, [entry for entry in auth.load(served.path) if entry.name != "bob"])
    with pytest.raises(ACPError) as revoked:
        await served.transport.open_stream(
            SUBSCRIBE, events_pb2.SubscribeEventsRequest(), options(ticket=ticket)
        )
    assert revoked.value.details["refinement"] == "PRINCIPAL_REVOKED"


async def test_a_client_of_the_prior_version_has_no_tickets(served: Served) -> None:
    with pytest.raises(ACPError) as older:
        await served.transport.call(
            TICKET, events_pb2.CreateStreamTicketRequest(), options(served.tokens["alice"], version="1.1")
        )
    assert older.value.code == "VERSION_MISMATCH"


async def test_an_expired_principal_is_refused_at_redemption(served: Served) -> None:
    """Expired, not removed: the principal is still in the file, its token past ``expires``."""
    bob = served.tokens["bob"]
    ticket = (
        await served.transport.call(TICKET, events_pb2.CreateStreamTicketRequest(), options(bob))
    ).ticket  # type: ignore[attr-defined]
    expire(served.path, "bob")
    assert [entry.name for entry in auth.load(served.path)] == ["alice", "bob"]
    with pytest.raises(ACPError) as expired:
        await served.transport.open_stream(
            SUBSCRIBE, events_pb2.SubscribeEventsRequest(), options(ticket=ticket)
        )
    assert expired.value.code == "AUTH_REQUIRED"
    assert expired.value.details["refinement"] == "PRINCIPAL_REVOKED"
    assert "expired" in expired.value.message


@pytest.mark.parametrize("how", ["expire", "revoke", "narrow"])
async def test_a_ticket_stream_ends_when_its_principal_expires_or_goes(served: Served, how: str) -> None:
    """The stream a ticket opened is checked against the file while it runs, as a token's
    is: it ends with AUTH_REQUIRED (within RECHECK_SECONDS; the guard only stops a hang).
    Issue 31, failure 6: a namespace taken from the principal ends it too, AUTH_FORBIDDEN
    (a ticket stream kept delivering that namespace's events)."""
    carol = auth.create_token(served.path, "carol", ["alice", "carol"])
    ticket = (
        await served.transport.call(TICKET, events_pb2.CreateStreamTicketRequest(), options(carol))
    ).ticket  # type: ignore[attr-defined]
    items = await served.transport.open_stream(
        SUBSCRIBE, events_pb2.SubscribeEventsRequest(), options(ticket=ticket)
    )
    try:
        if how == "expire":
            expire(served.path, "carol")
        elif how == "narrow":
            narrow(served.path, "carol", frozenset({"carol"}))
        else:
            auth.revoke_token(served.path, "carol")

        async def drain() -> None:
            async with asyncio.timeout(STREAM_GUARD_SECONDS):
                async for _ in items:
                    pass

        with pytest.raises(ACPError) as ended:
            await drain()
    finally:
        await items.aclose()  # type: ignore[attr-defined]
    if how == "narrow":
        assert ended.value.code == "AUTH_FORBIDDEN"
        assert ended.value.details["refinement"] == "PRINCIPAL_NARROWED"
        assert ended.value.details["namespaces"] == ["alice"]
        return
    assert ended.value.code == "AUTH_REQUIRED"
    assert ended.value.details["refinement"] == "PRINCIPAL_REVOKED"
