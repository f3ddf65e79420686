"""The PostgreSQL store's calls the event loop makes itself, on connections of its own in
libpq's nonblocking pipeline mode (pg_loop.py), without a store thread: the plain reads
(``read_get``, ``read_with_items``, ``read_query``...) and a record insert with nothing read
before it (``insert_alone``). A statement pg_wire does not take goes the threads' way."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

from cleveragents.acp.facade.store import rows
from cleveragents.acp.facade.store.base import ListQuery, Record, StoreFullError
from cleveragents.acp.facade.store.pg_errors import reraise, store_error
from cleveragents.acp.facade.store.pg_loop import LoopReads, LoopWrites, Rows
from cleveragents.acp.facade.store.pg_settings import CONNECT_TIMEOUT
from cleveragents.acp.facade.store.pg_statements import INSERT, clash, insert_params
from cleveragents.acp.facade.store.pg_transactions import PgTransactions
from cleveragents.acp.facade.store.pg_wire import PSYCOPG, Fallback
from cleveragents.acp.facade.store.requests import CLAIM


class LoopPaths(PgTransactions):
    """``PostgresStore``'s calls made on the loop's own connections."""

    # The store's (postgres.py).
    _conninfo: str

    def _open_loop_paths(self, connections: int, write_setup: tuple[str, ...]) -> None:
        """Each event loop's reads and writes are made on its first (``connections`` of each);
        a write connection runs ``write_setup`` first."""
        self._loop_connections = connections
        self._loops: dict[asyncio.AbstractEventLoop, LoopReads] = {}
        # A record insert with nothing read before it, the same way (``insert_alone``).
        self._loop_writes: dict[asyncio.AbstractEventLoop, LoopWrites] = {}
        self._write_setup = write_setup
        self._loops_lock = threading.Lock()

    # reads on the loop's own connections ----------------------------------------------

    async def read_get(self, kind: str, id: str) -> Record | None:
        answers = await self._loop_read([(self.sql.get, (kind, id))])
        if answers is PSYCOPG:
            return await super().read_get(kind, id)
        (found,) = answers
        return rows.record(found[0], rows.as_decoded) if found else None

    async def read_get_by_name(self, kind: str, namespace: str, name: str) -> Record | None:
        answers = await self._loop_read([(self.sql.get_by_name, (kind, namespace, name))])
        if answers is PSYCOPG:
            return await super().read_get_by_name(kind, namespace, name)
        (found,) = answers
        return rows.record(found[0], rows.as_decoded) if found else None

    async def read_with_items(
        self, kind: str, id: str, collection: str
    ) -> tuple[Record | None, list[tuple[int, bytes]]]:
        answers = await self._loop_read([(self.sql.get, (kind, id)), (self.sql.items, (collection, id))])
        if answers is PSYCOPG:
            return await super().read_with_items(kind, id, collection)
        records, items = answers
        return (rows.record(records[0], rows.as_decoded) if records else None), rows.items(items)

    async def read_query(self, query: ListQuery) -> list[Record]:
        statement = self._list_statement(query)
        if statement is None:
            return []
        answers = await self._loop_read([statement])
        if answers is PSYCOPG:
            return await super().read_query(query)
        (found,) = answers
        return [rows.record(row, rows.as_decoded) for row in found]

    async def read_items(self, collection: str, owner_id: str) -> list[tuple[int, bytes]]:
        answers = await self._loop_read([(self.sql.items, (collection, owner_id))])
        if answers is PSYCOPG:
            return await super().read_items(collection, owner_id)
        (found,) = answers
        return rows.items(found)

    async def _loop_read(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[Rows] | Fallback:
        """The statements' rows in one snapshot, on this loop's own connections; errors
        as the same statements give in ``read``."""
        if self._closing:
            raise RuntimeError("the store is closed")
        loop = asyncio.get_running_loop()
        reads = self._loops.get(loop)
        if reads is None:
            reads = self._loop_reads(loop)
        started = time.monotonic()
        try:
            return await reads.run(statements)
        except Exception as exc:
            reraise(exc, started)

    # a write on the loop's own connections ---------------------------------------------

    async def insert_alone(self, record: Record) -> None:
        """One INSERT committed on this loop's write connections (pg_loop.py), with the
        others queued meanwhile; under a request id (its row is written in the same
        transaction) through the writer threads."""
        claim = CLAIM.get()
        if self._closing:
            raise RuntimeError("the store is closed")
        if claim is not None and claim.open:
            await super().insert_alone(record)
            return
        loop = asyncio.get_running_loop()
        writes = self._loop_writes.get(loop)
        if writes is None:
            writes = self._loop_writes_of(loop)
        started = time.monotonic()
        try:
            written = await writes.write(INSERT, insert_params(record))
        except Exception as exc:
            # A full disk tells readiness here too, as the writer threads' writes do.
            if isinstance(store_error(exc, started), StoreFullError):
                self.note_full()
            reraise(exc, started)
        if written is PSYCOPG:
            await super().insert_alone(record)
            return
        self.full = None
        observer = self.observer
        if observer is not None:
            observer.waited("write", 0.0)
            observer.committed(time.monotonic() - started)
        if not written:
            raise clash(record)

    def _loop_reads(self, loop: asyncio.AbstractEventLoop) -> LoopReads:
        """This loop's reads, made on its first; those of loops closed meanwhile let go."""
        with self._loops_lock:
            _let_go_of_closed(self._loops)
            reads = self._loops[loop] = LoopReads(
                loop, self._conninfo, CONNECT_TIMEOUT, self._loop_connections
            )
            return reads

    def _loop_writes_of(self, loop: asyncio.AbstractEventLoop) -> LoopWrites:
        """This loop's writes, made on its first; those of loops closed meanwhile let go."""
        with self._loops_lock:
            _let_go_of_closed(self._loop_writes)
            writes = self._loop_writes[loop] = LoopWrites(
                loop, self._conninfo, CONNECT_TIMEOUT, self._loop_connections, self._write_setup
            )
            return writes

    def _close_loop_reads(self) -> None:
        """Fail the loop reads and writes still waiting and close their connections, each on
        its own loop's thread (or here, where that loop is closed, stopped, or this one)."""
        with self._loops_lock:
            lanes = [*self._loops.items(), *self._loop_writes.items()]
            self._loops, self._loop_writes = {}, {}
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        why = RuntimeError("the store is closed")
        for loop, reads in lanes:
            if loop.is_running() and not loop.is_closed() and loop is not here:
                closed = threading.Event()

                def close_there(reads: LoopReads = reads, closed: threading.Event = closed) -> None:
                    try:
                        reads.close(why)
                    finally:
                        closed.set()

                try:
                    loop.call_soon_threadsafe(close_there)
                except RuntimeError:  # closed meanwhile
                    reads.close(why)
                else:
                    closed.wait(CONNECT_TIMEOUT)
            else:
                reads.close(why)

    async def aclose(self) -> None:
        """Let the reads and writes under way on this loop finish, then close."""
        self._closing = True
        loop = asyncio.get_running_loop()
        for lane in (self._loops.get(loop), self._loop_writes.get(loop)):
            if lane is not None:
                await lane.drain()
        await asyncio.to_thread(self.close)


def _let_go_of_closed(lanes: dict[asyncio.AbstractEventLoop, Any]) -> None:
    """Close and forget the loop connections of event loops closed since."""
    for loop, lane in list(lanes.items()):
        if loop.is_closed():
            del lanes[loop]
            lane.close(RuntimeError("the event loop is closed"))
