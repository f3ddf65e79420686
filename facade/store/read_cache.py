"""Answers of reads kept while nobody has committed to the file since they were read.

A read the event loop can answer from here costs no hand-off to a reader thread (each
one a wake-up, and under load several sleeps of that thread on the GIL the loop holds:
``reads.py``). It is exact, not eventually fresh: every answer is kept under the
WAL-index header seen before it was asked for (``wal_index.py``), and the first look that
finds another header (any commit, by any connection of any process) drops them all. A
write acknowledged to anyone has rewritten the header, so nobody reads past it.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from typing import Generic, TypeVar

from cleveragents.acp.facade.store.wal_index import WalIndex

V = TypeVar("V")

# How many answers are kept, and their bytes (bodies and items) in all.
ENTRIES = 2048
BYTES = 8 << 20
# An answer bigger than this (a long session's history) is not kept.
LARGEST = 256 << 10


class ReadCache(Generic[V]):
    """Kept answers, least recently used dropped first; used on one event loop's thread
    (or under the GIL from any: no step awaits)."""

    def __init__(
        self, index: WalIndex, *, entries: int = ENTRIES, size: int = BYTES, largest: int = LARGEST
    ) -> None:
        self._index = index
        self._limit_entries = entries
        self._limit_size = size
        self._largest = largest
        self._state: bytes | None = None
        self._kept: collections.OrderedDict[Hashable, tuple[V, int]] = collections.OrderedDict()
        self._size = 0
        self.hits = 0
        self.misses = 0

    def look(self) -> bytes | None:
        """The header now, to ask ``get`` and ``put`` under; drops what an earlier one kept.
        None: unknown now, so nothing is answered from here."""
        state = self._index.state()
        if state != self._state:
            self.clear()
            self._state = state
        return state

    def get(self, state: bytes | None, key: Hashable) -> tuple[bool, V | None]:
        """(True, the answer) if one read under ``state`` is kept for ``key``."""
        if state is None or state != self._state:
            self.misses += 1
            return False, None
        kept = self._kept.get(key)
        if kept is None:
            self.misses += 1
            return False, None
        self._kept.move_to_end(key)
        self.hits += 1
        return True, kept[0]

    def put(self, state: bytes | None, key: Hashable, answer: V, size: int) -> None:
        """Keep ``answer``, read after ``look`` gave ``state``: unless a later look has seen
        another header (the answer may be older than that commit) or it is too big."""
        if state is None or state != self._state or size > self._largest:
            return
        old = self._kept.pop(key, None)
        if old is not None:
            self._size -= old[1]
        self._kept[key] = (answer, size)
        self._size += size
        while len(self._kept) > self._limit_entries or self._size > self._limit_size:
            _, (_, dropped) = self._kept.popitem(last=False)
            self._size -= dropped

    def clear(self) -> None:
        self._kept.clear()
        self._size = 0
        self._state = None
