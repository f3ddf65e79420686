"""The suite covers the catalog: every operation called, every error it can answer provoked,
on every transport. Runs after the rest of the contract suite (see conftest)."""

from __future__ import annotations

import pytest

from cleveragents.acp.contract import catalog
from tests.conformance.backends import KINDS
from tests.conformance.expected import expected_errors, missing
from tests.conformance.generated import SCENARIOS
from tests.conformance.harness import COVERAGE

CONTRIBUTORS = {f"scenario:{name}" for name in SCENARIOS} | {f"streaming:slow:{kind}" for kind in KINDS}


def require_full_run() -> None:
    absent = sorted(CONTRIBUTORS - COVERAGE.passed)
    if absent:
        pytest.skip(f"needs the whole contract suite to have passed; not run or failed: {absent}")


@pytest.mark.contract_summary
@pytest.mark.parametrize("kind", KINDS)
def test_every_operation_is_exercised(kind: str) -> None:
    require_full_run()
    assert sorted(set(catalog.OPERATIONS) - COVERAGE.operations(kind)) == []


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
