"""The backends the store conformance suite runs over: a fresh SQLite file, and a fresh
PostgreSQL schema (skipped, loudly, where none is reachable; required under CI=true)."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator

import pytest

from cleveragents.acp.facade.store.base import Store
from cleveragents.acp.facade.store.postgres import PostgresStore
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from tests import postgres


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[Callable[[], Store]]:
    """Opens a new store on the test's own database each call; all are closed after."""
    opened: list[Store] = []
    if request.param == "sqlite":
        path = tmp_path / "acp.db"

        def sqlite() -> Store:
            opened.append(SQLiteStore(path))
            return opened[-1]

        yield sqlite
    else:
        with postgres.fresh_schema() as url:

            def pg() -> Store:
                opened.append(PostgresStore(url))
                return opened[-1]

            try:
                yield pg
            finally:
                for store in opened:
                    store.close()
                opened.clear()
    for store in opened:
        store.close()


@pytest.fixture
def store(open_store: Callable[[], Store]) -> Store:
    return open_store()
