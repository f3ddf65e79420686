"""The request-id rows of every backend (facade/store/requests.py): a claim's row is stamped
in the transaction of the write it rides on, rolled back with it, never taken from another
live claim, and taken over past retention."""

from __future__ import annotations

import pytest

from cleveragents.acp.facade.store.base import Record, Store
from cleveragents.acp.facade.store.requests import CLAIM, Claim, RequestClaimedError
from tests.facade.store.conformance import request_entry as entry


def record(id_: str, body: bytes = b"body") -> Record:
    return Record(kind="session", id=id_, namespace="default", body=body, create_time=1.0, update_time=1.0)


def test_a_stamp_rides_on_the_write_and_holds_what_it_wrote(store: Store) -> None:
    claim = Claim(entry(), cutoff=0.0)
    token = CLAIM.set(claim)
    try:
        with store.transaction():
            store.insert(record("s1", b"first"))
            store.update(record("s1", b"second"))
            store.insert(record("s2", b"other"))
            store.delete("session", "s2")
    finally:
        CLAIM.reset(token)
    assert claim.stamped
    stored = store.get_request("alice", "r-1")
    assert stored is not None
    assert stored.answer is None
    assert stored.written == {("session", "s1"): b"second", ("session", "s2"): b"other"}
    assert (stored.operation, stored.digest, stored.owner, stored.time) == (
        "session.create",
        b"\x01" * 32,
        "owner-1",
        1000.0,
    )


def insert_then_fail(store: Store) -> None:
    with store.transaction():
        store.insert(record("s1"))
        raise RuntimeError("undo")


def test_a_rolled_back_write_leaves_no_stamp(store: Store) -> None:
    token = CLAIM.set(Claim(entry(), cutoff=0.0))
    try:
        with pytest.raises(RuntimeError):
            insert_then_fail(store)
    finally:
        CLAIM.reset(token)
    assert store.get_request("alice", "r-1") is None
    assert store.get("session", "s1") is None


def test_another_live_claim_keeps_the_id_and_the_write_rolls_back(store: Store) -> None:
    assert store.stamp_request(entry(owner="first"), cutoff=0.0)
    token = CLAIM.set(Claim(entry(owner="second"), cutoff=0.0))
    try:
        with pytest.raises(RequestClaimedError):
            store.insert(record("s1"))
    finally:
        CLAIM.reset(token)
    assert store.get("session", "s1") is None
    stored = store.get_request("alice", "r-1")
    assert stored is not None
    assert stored.owner == "first"


def test_past_retention_a_row_is_taken_over_and_pruned(store: Store) -> None:
    assert store.stamp_request(entry(owner="old", time=10.0), cutoff=0.0)
    assert not store.answer_request(entry(owner="new", time=500.0), cutoff=5.0)
    fresh = entry(owner="new", time=500.0)
    fresh.answer, fresh.error = b'{"code": "NOT_FOUND"}', True
    assert store.answer_request(fresh, cutoff=100.0)
    stored = store.get_request("alice", "r-1")
    assert stored is not None
    assert (stored.owner, stored.answer, stored.error) == ("new", b'{"code": "NOT_FOUND"}', True)
    assert store.stamp_request(entry(owner="other", time=20.0, request_id="r-2"), cutoff=0.0)
    assert store.prune_requests(older_than=100.0) == 1
    assert store.get_request("alice", "r-2") is None
    assert store.get_request("alice", "r-1") is not None


def test_without_a_claim_writes_stamp_nothing(store: Store) -> None:
    store.insert(record("s1"))
    claim = Claim(entry(), cutoff=0.0, open=False)
    token = CLAIM.set(claim)
    try:
        store.update(record("s1", b"later"))
    finally:
        CLAIM.reset(token)
    assert not claim.stamped
    assert store.get_request("alice", "r-1") is None


def test_a_sweep_drops_the_expired_rows_step_by_step_in_key_order(store: Store) -> None:
    for n, time in enumerate((10.0, 500.0, 20.0, 30.0, 600.0)):
        assert store.stamp_request(entry(owner=f"o{n}", time=time, request_id=f"r-{n}"), cutoff=0.0)
    swept, after, steps = 0, None, 0
    while True:
        removed, after = store.sweep_requests(100.0, after, 2)
        swept, steps = swept + removed, steps + 1
        if after is None:
            break
    assert swept == 3
    kept = [n for n in range(5) if store.get_request("alice", f"r-{n}") is not None]
    assert kept == [1, 4]
    # A store with an index on time (PostgreSQL) takes the pass in one step; SQLite, none.
    assert steps in (1, 3)
