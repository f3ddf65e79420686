"""Every scenario on the local, HTTP and gRPC transports: identical canonical traces."""

from __future__ import annotations

import pathlib

import pytest

from tests.conformance.generated import SCENARIOS
from tests.conformance.harness import COVERAGE, run_everywhere
from tests.server_process import Tokens


@pytest.mark.parametrize("name", sorted(SCENARIOS))
async def test_scenario(name: str, tmp_path: pathlib.Path, tokens: Tokens) -> None:
    trace = await run_everywhere(SCENARIOS[name], tmp_path, tokens)
    assert trace, "a scenario calls something"
    COVERAGE.passed.add(f"scenario:{name}")
