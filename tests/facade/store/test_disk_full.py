"""A full disk, as the store tells it: STORE_DISK_FULL, not retryable, and the store not
writable (what ``/readyz`` asks) until a write succeeds or space comes free.

PostgreSQL's ``disk_full`` (SQLSTATE 53100) comes from the real server: a trigger raises it,
as a full disk does, on both of the store's write paths (the writer threads, and the loop's
own insert that a call without a request id makes). SQLite's is a real full tmpfs."""

from __future__ import annotations

import psycopg
import pytest

from cleveragents.acp.facade.store.base import Store, StoreFullError
from cleveragents.acp.facade.store.postgres import PostgresStore
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from tests import postgres as pg
from tests.chaos.processes import fill, small_tmpfs
from tests.facade.store.conformance import record

FULL = """
CREATE FUNCTION full_disk() RETURNS trigger LANGUAGE plpgsql AS
$$ BEGIN RAISE EXCEPTION 'could not extend file: No space left on device' USING ERRCODE = 'disk_full'; END $$;
CREATE TRIGGER full_disk BEFORE INSERT ON records FOR EACH ROW EXECUTE FUNCTION full_disk();
"""


async def insert(store: Store, path: str, id: str, body: bytes = b"") -> None:
    if path == "loop":
        await store.insert_alone(record(id=id))
    else:

        def write(tx: Store) -> None:
            tx.insert(record(id=id, body=body) if body else record(id=id))

        await store.write(write)


@pytest.mark.parametrize("path", ["threads", "loop"])
async def test_postgresql_s_full_disk_is_store_disk_full_and_not_writable_until_a_write_succeeds(
    path: str,
) -> None:
    with pg.fresh_schema("full") as url:
        store = PostgresStore(url, loop_connections=1)
        try:
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(FULL)
            with pytest.raises(StoreFullError) as full:
                await insert(store, path, "01F")
            assert full.value.details["refinement"] == "STORE_DISK_FULL"
            assert full.value.details["retryable"] is False
            with pytest.raises(StoreFullError):
                store.check_writable()
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute("DROP TRIGGER full_disk ON records")
            await insert(store, path, "01G")
            store.check_writable()
            assert await store.read_get("session", "01F") is None
            assert await store.read_get("session", "01G") is not None
        finally:
            store.close()


async def test_a_refusal_told_after_space_came_free_leaves_the_store_writable() -> None:
    """Several writes refused at once: one caller is told (the space free read then) only
    after the operator freed space. That late reading must not become the mark space has to
    rise above: the store is writable (``/readyz`` ready) as soon as the space is there."""
    with small_tmpfs("4m") as disk:
        store = SQLiteStore(disk / "acp.db")
        try:
            filler = disk / "filler"
            fill(filler)
            with pytest.raises(StoreFullError):
                await _until_refused(store)
            with pytest.raises(StoreFullError):
                store.check_writable()
            filler.unlink()
            # Another refused write's caller, told now: what ``write`` does on SQLITE_FULL.
            store.note_full()
            store.check_writable()
        finally:
            store.close()


async def _until_refused(store: Store) -> None:
    """Writes until one is refused (the WAL may reuse space it had); bounded."""
    for index in range(200):
        await insert(store, "threads", f"01B{index:03}", b"x" * 65536)
    raise AssertionError("200 writes of 64 KiB fit on a full 4 MiB disk")
