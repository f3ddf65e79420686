"""Fixtures of the contract suite: one token file for every backend of the session."""

from __future__ import annotations

import pytest

from tests.server_process import Tokens


@pytest.fixture(scope="session")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Tokens:
    return Tokens.create(tmp_path_factory.mktemp("contract-tokens"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "contract_summary: checks what the whole contract suite recorded")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The summary checks run last, after every test whose recordings they read."""
    items.sort(key=lambda item: item.get_closest_marker("contract_summary") is not None)
