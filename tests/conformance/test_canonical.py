"""Times in traces are compared, not erased: the same instant gets the same label, and a
transport that answered one time for all (or the epoch) no longer matches (issue 18, item 11)."""

from __future__ import annotations

import datetime

import pytest

from tests.conformance.canonical import Canonicalizer


def _at(seconds: float) -> str:
    base = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    return (base + datetime.timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def test_the_same_instant_gets_the_same_label_however_written() -> None:
    first, later = _at(0), _at(1.5)
    as_offset = first.replace("Z", "+00:00")
    trace = {"a": first, "b": later, "c": as_offset, "d": f"created at {first}"}
    assert Canonicalizer()(trace) == {
        "a": "<time1>",
        "b": "<time2>",
        "c": "<time1>",
        "d": "created at <time1>",
    }


def test_a_transport_with_one_time_for_all_no_longer_matches() -> None:
    honest = {"create_time": _at(0), "update_time": _at(2), "events": [{"time": _at(1)}]}
    frozen = {"create_time": _at(0), "update_time": _at(0), "events": [{"time": _at(0)}]}
    assert Canonicalizer()(honest) != Canonicalizer()(frozen)


def test_a_time_not_of_this_run_is_an_error() -> None:
    with pytest.raises(AssertionError, match="not of this run"):
        Canonicalizer()({"time": "1970-01-01T00:00:00Z"})


def test_details_compare_types_not_only_values() -> None:
    """``{"retryable": True} == {"retryable": 1}`` in Python; the canonical form tells them apart."""
    assert Canonicalizer()({"details": {"retryable": True}}) != Canonicalizer()({"details": {"retryable": 1}})
    assert Canonicalizer()({"n": 2.0}) == Canonicalizer()({"n": 2})
