"""Fixtures of the security suite: principals of every role in namespace ``default``."""

from __future__ import annotations

import pytest

from cleveragents.acp.contract.call import Role
from cleveragents.acp.facade import auth
from tests.server_process import Tokens


@pytest.fixture(scope="session")
def role_tokens(tmp_path_factory: pytest.TempPathFactory) -> Tokens:
    """``reader``, ``writer`` and ``admin`` of ``default``, beside the contract suite's
    principals (alice builds the worlds the matrices run over)."""
    made = Tokens.create(tmp_path_factory.mktemp("security-tokens"))
    for role in Role:
        made.tokens[str(role)] = auth.create_token(made.path, str(role), ["default"], role=role)
    return made
