"""Stream tickets are capped (issue 17 bounds): a principal holds at most MAX_PER_PRINCIPAL
unused tickets and the server MAX_OUTSTANDING, so no caller can fill the store with them.
Past a cap: BUDGET_EXCEEDED (TOO_MANY_TICKETS) on every transport; a ticket used or expired
frees its place."""

from __future__ import annotations

import contextlib
import pathlib
import threading
from collections.abc import Callable, Iterator

import orjson
import pytest

from cleveragents.acp.contract.call import CallContext, Principal
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.events import tickets
from cleveragents.acp.facade.store.base import Store
from cleveragents.acp.facade.store.postgres import PostgresStore
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import events_pb2
from tests import postgres
from tests.conformance.harness import Run, run_everywhere
from tests.server_process import Tokens


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def who(name: str) -> CallContext:
    return CallContext(principal=Principal(name, None))


def issue(issuer: tickets.StreamTickets, name: str) -> str:
    return issuer.issue_now(who(name), events_pb2.CreateStreamTicketRequest()).ticket


def too_many(issuer: tickets.StreamTickets, name: str) -> ACPError:
    with pytest.raises(ACPError) as refused:
        issue(issuer, name)
    assert refused.value.code == "BUDGET_EXCEEDED", refused.value
    assert refused.value.details["refinement"] == "TOO_MANY_TICKETS"
    return refused.value


def test_a_principal_holds_at_most_its_cap_until_one_is_used_or_expires(tmp_path: pathlib.Path) -> None:
    store = SQLiteStore(tmp_path / "acp.db")
    try:
        clock = Clock()
        issuer = tickets.StreamTickets(store, None, clock=clock)
        held = [issue(issuer, "alice") for _ in range(tickets.MAX_PER_PRINCIPAL)]
        refused = too_many(issuer, "alice")
        assert refused.details["max_tickets"] == tickets.MAX_PER_PRINCIPAL
        assert "alice" in refused.message
        # Another principal is not held back by alice's tickets.
        issue(issuer, "bob")
        # A ticket presented (whatever the outcome) frees its place.
        issuer.redeem_now(held[0], "events.subscribe", events_pb2.SubscribeEventsRequest())
        issue(issuer, "alice")
        too_many(issuer, "alice")
        # Expired tickets free theirs.
        clock.now += issuer.ttl_seconds
        for _ in range(tickets.MAX_PER_PRINCIPAL):
            issue(issuer, "alice")
        too_many(issuer, "alice")
    finally:
        store.close()


def test_the_server_holds_at_most_max_outstanding(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tickets, "MAX_OUTSTANDING", 3 * tickets.MAX_PER_PRINCIPAL // 2)
    store = SQLiteStore(tmp_path / "acp.db")
    try:
        clock = Clock()
        issuer = tickets.StreamTickets(store, None, clock=clock)
        for index in range(tickets.MAX_OUTSTANDING):
            issue(issuer, f"p{index % 2}")
        refused = too_many(issuer, "p2")
        assert refused.details["max_tickets"] == tickets.MAX_OUTSTANDING
        assert "server" in refused.message
        clock.now += issuer.ttl_seconds
        issue(issuer, "p2")
        # What the store counts is what is outstanding: nothing of the expired ones.
        assert outstanding(store) == 1
    finally:
        store.close()


def outstanding(store: Store) -> int:
    counter = store.get(tickets.COUNTER_KIND, tickets.COUNTER_ID)
    assert counter is not None
    return int(orjson.loads(counter.body)["count"])


@pytest.fixture(params=["sqlite", "postgres"])
def shared(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[Callable[[], Store]]:
    """Opens another store over one database each call (another worker or replica)."""
    opened: list[Store] = []
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            path = tmp_path / "acp.db"

            def make() -> Store:
                return SQLiteStore(path)

        else:
            url = stack.enter_context(postgres.fresh_schema())

            def make() -> Store:
                return PostgresStore(url)

        def opener() -> Store:
            opened.append(make())
            return opened[-1]

        try:
            yield opener
        finally:
            for store in opened:
                store.close()


def test_the_caps_hold_across_processes_over_one_database(shared: Callable[[], Store]) -> None:
    """Two issuers over one database (two workers of a server) count the same tickets: each
    gives half, the next is refused by both; one redeemed through either frees its place
    for both; the total cap counts both issuers' tickets too."""
    clock = Clock()
    first, second = (tickets.StreamTickets(shared(), None, clock=clock) for _ in range(2))
    held = [issue(first if index % 2 else second, "alice") for index in range(tickets.MAX_PER_PRINCIPAL)]
    too_many(first, "alice")
    too_many(second, "alice")
    second.redeem_now(held[1], "events.subscribe", events_pb2.SubscribeEventsRequest())
    issue(first, "alice")
    too_many(second, "alice")
    clock.now += first.ttl_seconds
    issue(second, "alice")
    assert outstanding(shared()) == 1


def test_concurrent_issuers_over_one_database_never_pass_the_cap(shared: Callable[[], Store]) -> None:
    """Issuers in threads of their own, all at once, as many tries as twice the cap: exactly
    the cap is issued (on PostgreSQL the writes run concurrently; the counter's row lock
    orders them)."""
    clock = Clock()
    issuers = [tickets.StreamTickets(shared(), None, clock=clock) for _ in range(4)]
    start = threading.Barrier(len(issuers))
    given: list[str] = []
    refused: list[str] = []

    def run(issuer: tickets.StreamTickets) -> None:
        start.wait(30)
        for _ in range(tickets.MAX_PER_PRINCIPAL // 2):
            try:
                given.append(issue(issuer, "alice"))
            except ACPError as err:
                refused.append(str(err.details["refinement"]))

    threads = [threading.Thread(target=run, args=(issuer,)) for issuer in issuers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(given) == tickets.MAX_PER_PRINCIPAL
    assert refused == ["TOO_MANY_TICKETS"] * tickets.MAX_PER_PRINCIPAL
    assert outstanding(shared()) == tickets.MAX_PER_PRINCIPAL


async def capped(run: Run) -> None:
    alice = run.client("alice")
    for _ in range(tickets.MAX_PER_PRINCIPAL):
        await alice.call("events.ticket", namespace="default")
    err = await run.fails(
        alice.call("events.ticket", namespace="default"), "BUDGET_EXCEEDED", "TOO_MANY_TICKETS"
    )
    assert err.details["max_tickets"] == tickets.MAX_PER_PRINCIPAL
    await run.client("bob").call("events.ticket", namespace="other")


async def test_over_the_cap_is_budget_exceeded_on_every_transport(tmp_path: pathlib.Path) -> None:
    await run_everywhere(capped, tmp_path, Tokens.create(tmp_path))
