"""docs/testing.md reports test functions and parametrized cases separately, with the
numbers `make test` collects (tests/collection_counts.py writes them)."""

from __future__ import annotations

import pytest

from tests import collection_counts


@pytest.mark.timeout(collection_counts.COLLECT_TIMEOUT + 60)
def test_the_counts_in_docs_testing_md_are_the_collected_ones(pytestconfig: pytest.Config) -> None:
    counts = collection_counts.Counts.of(collection_counts.collected(pytestconfig))
    assert counts.items > counts.functions > len(counts.parametrized) > 0
    written = collection_counts.documented(collection_counts.DOC.read_text())
    assert written == counts.block(), "run: python -m tests.collection_counts --write"


def test_functions_and_cases_are_counted_apart() -> None:
    # Schemathesis' cases are listed under the function's bare id, once per case.
    ids = ["t.py::a", "t.py::b[1]", "t.py::b[2]", "t.py::c[x]", "u.py::C::d", "v.py::e", "v.py::e"]
    counts = collection_counts.Counts.of(ids)
    assert (counts.items, counts.functions) == (7, 5)
    assert counts.parametrized == {"t.py::b": 2, "t.py::c": 1, "v.py::e": 2}
    block = counts.block()
    assert "7 items from **5 test functions**: 2 plain functions" in block
    assert "3 parametrized ones, which make 5 items" in block
