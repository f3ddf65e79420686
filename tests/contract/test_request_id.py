"""Request ids are ULIDs: python-ulid reads them back, with the current time, all distinct."""

from __future__ import annotations

import itertools
import time

import pytest
from ulid import ULID

from cleveragents.acp.contract import envelope
from cleveragents.acp.contract.envelope import new_request_id


def test_request_ids_are_ulids_of_now_and_distinct() -> None:
    before = int(time.time() * 1000)
    ids = [new_request_id() for _ in range(5000)]
    after = int(time.time() * 1000)
    assert len(set(ids)) == len(ids)
    for value in ids:
        parsed = ULID.from_str(value)
        assert str(parsed) == value
        assert before - 1 <= parsed.milliseconds <= after + 1


def test_request_ids_sort_by_time() -> None:
    first = new_request_id()
    time.sleep(0.003)
    assert new_request_id()[:10] > first[:10]


def test_ids_of_one_millisecond_count_up_and_stay_distinct_past_the_counter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first = new_request_id()
    ms = ULID.from_str(first).milliseconds
    # The counter of the low 20 bits about to run out: the next ids start afresh.
    monkeypatch.setattr(envelope, "_state", (ms, first[:-4], itertools.count((1 << 20) - 2)))
    ids = [new_request_id() for _ in range(4)]
    assert len({first, *ids}) == 5
    for value in ids:
        assert str(ULID.from_str(value)) == value
        assert ULID.from_str(value).milliseconds >= ms
    same_ms = [value for value in ids if value[:10] == first[:10]]
    if same_ms and same_ms[0][:-4] == first[:-4]:
        assert same_ms[0] > first
