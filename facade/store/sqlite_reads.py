"""How the SQLite store's reads reach its reader threads, or are answered from memory.

``read(fn)`` runs ``fn`` on a reader thread (``reads.ReadLane``) in one read transaction, on
that thread's own read-only connection; in WAL mode it never waits for the write lock,
whoever holds it. The plain reads the loop awaits (``read_get``, ``read_with_items``,
``read_get_by_name``, ``read_items``) are one statement each, which is its own snapshot,
and point reads by primary key that a reader takes at once go in one statement together
(``PointRead``); while nobody commits, point and by-name reads are answered again from
memory (``read_cache.py``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import pathlib
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar, cast

import orjson

from cleveragents.acp.facade.store import rows
from cleveragents.acp.facade.store.base import Record, Store
from cleveragents.acp.facade.store.read_cache import ReadCache
from cleveragents.acp.facade.store.reads import Outcome, ReadLane
from cleveragents.acp.facade.store.sql_store import SQLStore
from cleveragents.acp.facade.store.wal_index import WalIndex

log = logging.getLogger(__name__)
T = TypeVar("T")

# Times as text of 17 significant digits: a REAL in JSON keeps only 15.
_POINT_RECORD = (
    "json_array(r.kind, r.id, r.namespace, r.name, r.revision, r.state, r.attrs, r.labels, "
    "printf('%!.17g', r.create_time), printf('%!.17g', r.update_time), hex(r.body))"
)


@functools.cache
def _points_statement(records: int, owners: int) -> str:
    """The records of ``records`` (kind, id) pairs and the items of ``owners`` (collection,
    owner_id) pairs, each as a JSON array; both looked up by primary key."""
    keys = ",".join(["(?,?)"] * records)
    found = (
        f"SELECT json_group_array({_POINT_RECORD}) FROM (VALUES {keys}) AS k "
        "CROSS JOIN records AS r ON r.kind = k.column1 AND r.id = k.column2"
    )
    if not owners:
        return f"SELECT ({found}), '[]'"
    pairs = ",".join(["(?,?)"] * owners)
    listed = (
        "SELECT json_group_array(json_array(i.collection, i.owner_id, i.idx, hex(i.body))) "
        f"FROM (VALUES {pairs}) AS k "
        "CROSS JOIN items AS i ON i.collection = k.column1 AND i.owner_id = k.column2"
    )
    return f"SELECT ({found}), ({listed})"


def _first(item: tuple[int, bytes]) -> int:
    return item[0]


# A point read's answer: the record (None: there is none) and its items, if any were asked.
Answer = tuple[Record | None, list[tuple[int, bytes]]]
# What a kept answer costs beside its bodies (the objects around them), roughly.
_KEPT_OVERHEAD = 300


def _copied(answer: Answer) -> Answer:
    """An answer no caller of ``read_cache`` shares with another: a Record and its dicts
    may be changed by whoever got them (bodies and item tuples are immutable)."""
    record, items = answer
    if record is not None:
        # The constructor, not copy.copy: a third of the cost, on every answer from memory.
        record = Record(
            kind=record.kind,
            id=record.id,
            namespace=record.namespace,
            body=record.body,
            name=record.name,
            revision=record.revision,
            state=record.state,
            attrs=dict(record.attrs),
            labels=dict(record.labels),
            create_time=record.create_time,
            update_time=record.update_time,
        )
    return record, list(items)


def _size(answer: Answer) -> int:
    record, items = answer
    size = _KEPT_OVERHEAD + (len(record.body) if record is not None else 0)
    return size + sum(len(body) + 64 for _, body in items)


class PointRead:
    """A read of one record, and of its items in ``collection`` when one is named, by
    primary key: the reader answers those it takes at once together (``ReadLane``)."""

    __slots__ = ("collection", "id", "kind", "queued", "together")

    def __init__(
        self,
        together: Callable[[list[PointRead]], list[Outcome]],
        kind: str,
        id: str,
        collection: str | None,
        queued: float,
    ) -> None:
        self.together = together
        self.kind = kind
        self.id = id
        self.collection = collection
        self.queued = queued

    def answer(
        self,
        records: Mapping[tuple[str, str], Record],
        items: Mapping[tuple[str, str], list[tuple[int, bytes]]],
    ) -> tuple[Record | None, list[tuple[int, bytes]]]:
        """Its answer from what one statement found for it and the others."""
        if self.collection is None:
            return records.get((self.kind, self.id)), []
        return records.get((self.kind, self.id)), items.get((self.collection, self.id), [])

    def __call__(self) -> tuple[Record | None, list[tuple[int, bytes]]]:
        error, result = self.together([self])[0]
        if error is not None:
            raise error
        return cast(tuple[Record | None, list[tuple[int, bytes]]], result)


class SQLiteReads(SQLStore):
    """The read side of ``SQLiteStore``."""

    # The store's (sqlite.py).
    path: pathlib.Path
    _closed: bool

    def _open_reads(self, readers: int, index: WalIndex | None) -> None:
        """The reader threads and their connections; the read cache over ``index`` (None:
        no cache)."""
        # Read connections, one per thread that reads (reader pool, or a blocking caller).
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._reads = ReadLane(readers, "acp-store-read")
        # Point and by-name reads answered on the loop while nobody commits (read_cache.py).
        self._cache: ReadCache[Answer] | None = ReadCache(index) if index is not None else None
        # The one event loop that uses the cache (it has no lock): another one's reads go
        # to the readers, until the first is closed.
        self._cache_loop: asyncio.AbstractEventLoop | None = None

    async def read(self, fn: Callable[[Store], T], *, urgent: bool = False) -> T:
        return await self._read(fn, urgent=urgent)

    # One statement each, which is its own snapshot: no BEGIN and COMMIT around it. The
    # sqlite3 module lets go of the GIL at each statement's start and end and twice per row,
    # and the busy event loop takes it each time: the reader thread then sleeps until it gets
    # it back (a loop thread busy meanwhile: 111 µs of reader CPU for a read of 4
    # statements against 27 µs for one).
    # Reads by primary key the reader takes at once go in one statement (``_read_points``).

    async def read_get(self, kind: str, id: str) -> Record | None:
        record, _ = await self._read_point(kind, id, None)
        return record

    async def read_with_items(
        self, kind: str, id: str, collection: str
    ) -> tuple[Record | None, list[tuple[int, bytes]]]:
        return await self._read_point(kind, id, collection)

    async def _read_point(
        self, kind: str, id: str, collection: str | None
    ) -> tuple[Record | None, list[tuple[int, bytes]]]:
        async def read() -> Answer:
            point = PointRead(self._read_points, kind, id, collection, time.monotonic())
            return cast(Answer, await self._reads.run(point))

        return await self._cached((kind, id, collection), read)

    async def _cached(self, key: tuple[str | None, ...], read: Callable[[], Awaitable[Answer]]) -> Answer:
        """``read()``'s answer, or the one kept for ``key`` if nobody committed since."""
        if self._closed:
            raise RuntimeError("the store is closed")
        cache = self._cache_here()
        if cache is None:
            return await read()
        state = cache.look()
        found, kept = cache.get(state, key)
        if found:
            return _copied(cast(Answer, kept))
        answer = await read()
        cache.put(state, key, _copied(answer), _size(answer))
        return answer

    def read_cache_counts(self) -> tuple[int, int]:
        cache = self._cache
        return (cache.hits, cache.misses) if cache is not None else (0, 0)

    def _cache_here(self) -> ReadCache[Answer] | None:
        """The read cache, if this loop is the one using it."""
        if self._cache is None:
            return None
        loop = asyncio.get_running_loop()
        owner = self._cache_loop
        if owner is loop:
            return self._cache
        if owner is not None and not owner.is_closed():
            return None
        with self._readers_lock:
            if self._cache_loop is not owner:
                return None
            self._cache.clear()
            self._cache_loop = loop
        return self._cache

    async def read_get_by_name(self, kind: str, namespace: str, name: str) -> Record | None:
        def get(store: Store) -> Record | None:
            return store.get_by_name(kind, namespace, name)

        async def read() -> Answer:
            return await self._read(get, transaction=False), []

        record, _ = await self._cached(("by-name", kind, namespace, name), read)
        return record

    async def read_items(self, collection: str, owner_id: str) -> list[tuple[int, bytes]]:
        return await self._read(lambda store: store.list_items(collection, owner_id), transaction=False)

    async def _read(self, fn: Callable[[Store], T], *, urgent: bool = False, transaction: bool = True) -> T:
        """``transaction``: ``fn`` makes more than one statement, which must see one snapshot."""
        if self._closed:
            raise RuntimeError("the store is closed")
        # The caller's context travels with fn (its trace, read by what fn records).
        context = contextvars.copy_context()
        queued = time.monotonic()
        return await self._reads.run(
            functools.partial(context.run, self._read_now, fn, queued, transaction), urgent=urgent
        )

    def _read_now(self, fn: Callable[[Store], T], queued: float, transaction: bool) -> T:
        observer = self.observer
        if observer is not None:
            observer.waited("read", time.monotonic() - queued)
        if not transaction:
            return fn(self)
        db = self._reader()
        db.execute("BEGIN")
        try:
            return fn(self)
        finally:
            db.execute("COMMIT")

    def _read_points(self, reads: list[PointRead]) -> list[Outcome]:
        """On a reader thread: the records (and items) of ``reads``, in one statement. If it
        fails (one answer over SQLite's length limit, SQLITE_TOOBIG, though each fits
        alone; or a fault), each read is made alone and meets its own fault, if any."""
        observer = self.observer
        if observer is not None:
            now = time.monotonic()
            for read in reads:
                observer.waited("read", now - read.queued)
        if len(reads) > 1:
            try:
                records, items = self._points(reads)
            except sqlite3.Error:
                log.debug("point reads made one by one after their statement failed", exc_info=True)
            else:
                return [(None, read.answer(records, items)) for read in reads]
        return [self._read_point_alone(read) for read in reads]

    def _read_point_alone(self, read: PointRead) -> Outcome:
        try:
            if read.collection is None:
                return None, (self.get(read.kind, read.id), [])
            return None, self.get_with_items(read.kind, read.id, read.collection)
        except Exception as exc:  # handed to the caller
            return exc, None

    def _points(
        self, reads: list[PointRead]
    ) -> tuple[dict[tuple[str, str], Record], dict[tuple[str, str], list[tuple[int, bytes]]]]:
        """One row whatever the number of reads and items: each row costs the reader two
        more hand-offs of the GIL (``_read_point``), so the rows come as two JSON arrays."""
        keys = list(dict.fromkeys((read.kind, read.id) for read in reads))
        owners = list(
            dict.fromkeys((read.collection, read.id) for read in reads if read.collection is not None)
        )
        params = [value for key in keys + owners for value in key]
        found, listed = self._one(_points_statement(len(keys), len(owners)), params)
        records: dict[tuple[str, str], Record] = {}
        for row in orjson.loads(found):
            # The times and the body as _POINT_RECORD wrote them: text, and hex.
            row[8:] = float(row[8]), float(row[9]), bytes.fromhex(row[10])
            point = rows.record(row, self.read_maps)
            records[point.kind, point.id] = point
        items: dict[tuple[str, str], list[tuple[int, bytes]]] = {}
        for collection, owner_id, idx, body in orjson.loads(listed):
            items.setdefault((collection, owner_id), []).append((idx, bytes.fromhex(body)))
        for owned in items.values():
            owned.sort(key=_first)
        return records, items

    def _reader(self) -> sqlite3.Connection:
        db: sqlite3.Connection | None = getattr(self._local, "db", None)
        if db is None:
            if self._closed:
                raise RuntimeError("the store is closed")
            db = sqlite3.connect(str(self.path), isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA query_only=ON")
            db.execute("PRAGMA busy_timeout=5000")
            with self._readers_lock:
                self._readers.append(db)
            self._local.db = db
        return db
