"""Fixtures of the contract suite: one token file for every backend of the session."""

from __future__ import annotations

import pytest

from cleveragents.acp.contract.call import Role
from cleveragents.acp.facade import auth
from tests.server_process import Tokens


@pytest.fixture(scope="session")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Tokens:
    """The suite's principals, and a ``reader`` of ``default``: an operation reached by id
    names no namespace, so refusing it for its role is how it answers AUTH_FORBIDDEN."""
    made = Tokens.create(tmp_path_factory.mktemp("contract-tokens"))
    made.tokens["reader"] = auth.create_token(made.path, "reader", ["default"], role=Role.READER)
    return made


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "contract_summary: checks what the whole contract suite recorded")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The summary checks run last, after every test whose recordings they read."""
    items.sort(key=lambda item: item.get_closest_marker("contract_summary") is not None)
