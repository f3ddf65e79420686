"""Request ids are ULIDs: python-ulid reads them back, with the current time, all distinct."""

from __future__ import annotations

import time

from ulid import ULID

from cleveragents.acp.facade.contract.envelope import new_request_id


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
