"""Shared fixtures: a real facade over a real SQLite file, and a local client on it."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.service_facade import ServiceFacade
from tests import browser

pytest_plugins = ["tests.hygiene"]


def pytest_report_header(config: pytest.Config) -> str | None:
    return browser.header()


@pytest.fixture
def db_path(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "acp.db"


@pytest.fixture
async def facade(db_path: pathlib.Path) -> AsyncIterator[ServiceFacade]:
    facade = open_facade(db_path)
    yield facade
    await facade.close()


@pytest.fixture
async def client(facade: ServiceFacade) -> AsyncIterator[ACPClient]:
    client = ACPClient(LocalTransport(facade))
    yield client
    await client.close()
