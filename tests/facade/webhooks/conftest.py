"""The webhook tests' delivering facade, on a real SQLite file, and a client of it."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator

import pytest

from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.acp_client import ACPClient
from cleveragents.acp.facade.service_facade import ServiceFacade
from tests.facade.webhooks.helpers import delivering, fast_retries


@pytest.fixture
async def served(
    db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[ServiceFacade, ACPClient]]:
    fast_retries(monkeypatch)
    facade = delivering(db_path)
    client = ACPClient(LocalTransport(facade))
    yield facade, client
    await client.close()
    await facade.close()
