"""The Store contract (conformance.py) on every backend: SQLite and PostgreSQL."""

from __future__ import annotations

from tests.facade.store.conformance import StoreConformance


class TestStore(StoreConformance):
    pass
