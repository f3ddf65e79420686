"""Shared fixtures: a real facade over a real SQLite file, and a local client on it."""

from __future__ import annotations

import asyncio
import gc
import os
import pathlib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.gateway import loops
from tests import browser, needs
from tests.server_process import Children

# tests.postgres: the pg_url fixture (a fresh PostgreSQL schema per test) and its header line;
# tests.collection_counts: the node ids of a session that collects the whole suite.
pytest_plugins = ["tests.hygiene", "tests.postgres", "tests.collection_counts"]


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Loud lines for the tests that will skip (fail under CI=true) for want of something."""
    return [line for line in (browser.header(), *needs.header()) if line is not None]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    needs.summary(terminalreporter)


# In-process tests run on asyncio's loop unless ACP_TEST_LOOP=uvloop (``make test-loops``,
# which also serves the subprocess servers on asyncio's: every test then ran on both).
TEST_LOOP: loops.Loop = "uvloop" if os.environ.get("ACP_TEST_LOOP") == "uvloop" else "asyncio"


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    return {TEST_LOOP: loops.factory(TEST_LOOP)}


WEB_TESTS = pathlib.Path(__file__).parent / "gateway" / "web"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The browser tests run last: Playwright's sync API leaves an event loop marked running in
    the main thread, and every asyncio test after it would fail to start its own. (A stable
    sort: the order other hooks chose is kept within each group.)"""
    items.sort(key=lambda item: WEB_TESTS in item.path.parents)


@pytest.fixture(autouse=True, scope="module")
def _garbage_of_the_module() -> Iterator[None]:
    """What a module's tests left unclosed in a reference cycle (a socket, a transport) is
    collected, and its ResourceWarning fails the run, in that module's last test: not in
    whichever later test the garbage collector happens to run (a socket an HTTP client
    left open once failed an unrelated test three directories later)."""
    yield
    gc.collect()


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


@pytest.fixture
def children() -> Iterator[Children]:
    """Start a test's processes here: killed with their process groups however it ends."""
    started = Children()
    try:
        yield started
    finally:
        started.kill_all()
