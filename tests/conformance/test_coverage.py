"""The suite covers the catalog: every operation exercised, every error it can answer
provoked, on every transport, counting only outcomes a test asserted (``harness.COVERAGE``).
Runs after the rest of the contract suite (see conftest)."""

from __future__ import annotations

import pytest

from cleveragents.acp.contract import catalog
from tests.conformance.backends import KINDS
from tests.conformance.expected import DOMAIN, expected_errors, missing
from tests.conformance.generated import SCENARIOS
from tests.conformance.harness import COVERAGE

CONTRIBUTORS = {f"scenario:{name}" for name in SCENARIOS} | {f"streaming:slow:{kind}" for kind in KINDS}


def require_full_run() -> None:
    absent = sorted(CONTRIBUTORS - COVERAGE.passed)
    if absent:
        pytest.skip(f"needs the whole contract suite to have passed; not run or failed: {absent}")


# Refusals at the gate (token, version) say nothing about the operation itself.
GATES = frozenset({"AUTH_REQUIRED", "AUTH_FORBIDDEN", "VERSION_MISMATCH"})


def exercised(kind: str) -> set[str]:
    """Operations whose checked answer was a success, or an asserted error the expectations
    name for them past the gate: a call refused for its token does not exercise the operation."""
    expected = expected_errors()
    reached = {
        name
        for name, code, refinement in COVERAGE.codes(kind)
        if code not in GATES and any(e[:2] == (name, code) and e[2] in (None, refinement) for e in expected)
    }
    return COVERAGE.successes(kind) | reached


@pytest.mark.contract_summary
@pytest.mark.parametrize("kind", KINDS)
def test_every_operation_is_exercised(kind: str) -> None:
    require_full_run()
    assert sorted(set(catalog.OPERATIONS) - exercised(kind)) == []


@pytest.mark.contract_summary
@pytest.mark.parametrize("kind", KINDS)
def test_every_error_of_every_operation_is_provoked(kind: str) -> None:
    require_full_run()
    assert missing(COVERAGE.codes(kind)) == []


def test_the_expectations_name_only_catalog_operations_and_codes() -> None:
    from cleveragents.acp.contract.errors import TABLE

    for name, code, _ in expected_errors():
        assert name in catalog.OPERATIONS
        assert code in TABLE
    # The hand-written table by its own keys: a misspelt name would vanish from the set above.
    assert sorted(set(DOMAIN) - set(catalog.OPERATIONS)) == []
    assert sorted({code for rules in DOMAIN.values() for code, _ in rules} - set(TABLE)) == []
