"""Stream tickets are capped (issue 17 bounds): a principal holds at most MAX_PER_PRINCIPAL
unused tickets and the server MAX_OUTSTANDING, so no caller can fill the store with them.
Past a cap: BUDGET_EXCEEDED (TOO_MANY_TICKETS) on every transport; a ticket used or expired
frees its place."""

from __future__ import annotations

import pathlib

import pytest

from cleveragents.acp.contract.call import CallContext, Principal
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain import tickets
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import events_pb2
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
        # What the issuer remembers is what is outstanding: nothing of the expired ones.
        assert issuer._count == 1
        assert list(issuer._outstanding) == ["p2"]
    finally:
        store.close()


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
