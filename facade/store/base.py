"""The storage interface the domain services use, narrow enough for a PostgreSQL twin.

Entities of every kind live as *records*: a few indexed columns (kind, id, namespace,
name, revision, state, attrs, labels) and the entity itself as serialized proto bytes.
Ordered child rows (a session's messages) are *items*. The event log has its own table
(see ``append_events``) because its sequence is global.

The server's event loop never waits for storage: it awaits ``Store.read(fn)`` and
``Store.write(fn)``, which run ``fn`` on a store thread inside one transaction (a read
snapshot, or a write the store commits together with the writes queued beside it). The
synchronous methods act in the transaction of the store thread they are called on, so
a function given to ``read``/``write`` may use the store itself (or helpers that take
it) and see one snapshot. Called on any other thread they run there, blocking it: for
tools, tests and the services not yet converted.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from cleveragents.acp.contract.errors import ACPError, ErrorCode

T = TypeVar("T")

# How long a write waits for a write lock another process holds before it gives up.
DEFAULT_WRITE_TIMEOUT = 5.0


class StoreConflictError(Exception):
    """A record with the same (kind, namespace, name) or (kind, id) exists."""


class SchemaTooNewError(ValueError):
    """The database was written by a newer release: opening it could corrupt it (a
    ValueError: a setting to change, as callers that open stores report those)."""


class StoreUnavailableError(OSError):
    """The database cannot be opened: unreachable, refusing the connection, or failing a
    migration (an OSError: what callers that open stores already report in one line)."""


class StoreBusyError(ACPError):
    """A write waited its whole bound for a lock another process holds; nothing of it was
    written, so the caller may retry it as it was (docs/server.md, "A locked database")."""

    def __init__(self, waited: float) -> None:
        super().__init__(
            ErrorCode.BUDGET_EXCEEDED,
            f"the database stayed locked by another process for {waited:.1f} s, so nothing was "
            "written; retry the call",
            {"retryable": True, "waited_seconds": round(waited, 3)},
            refinement="STORE_BUSY",
        )


class StaleRevisionError(Exception):
    """The record is not at the revision the writer read."""

    def __init__(self, current: int) -> None:
        super().__init__(f"current revision is {current}")
        self.current = current


@dataclass
class Record:
    kind: str
    id: str
    namespace: str
    body: bytes
    name: str | None = None
    revision: int = 1
    state: str = ""
    # Indexed string attributes lists filter on (orchestrator, project, session_id...).
    attrs: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    # Seconds since the epoch.
    create_time: float = 0.0
    update_time: float = 0.0


@dataclass(frozen=True)
class StoredEvent:
    sequence: int
    namespace: str
    type: str
    plan_id: str
    session_id: str
    time: float
    body: bytes


@dataclass(frozen=True)
class EventFilter:
    """Which events a reader wants; empty fields match everything."""

    # None: every namespace; an empty set: none.
    namespaces: frozenset[str] | None = None
    plan_id: str = ""
    session_id: str = ""
    types: frozenset[str] = frozenset()

    def matches(self, namespace: str, type: str, plan_id: str, session_id: str) -> bool:
        return (
            (self.namespaces is None or namespace in self.namespaces)
            and (not self.plan_id or plan_id == self.plan_id)
            and (not self.session_id or session_id == self.session_id)
            and (not self.types or type in self.types)
        )


@dataclass(frozen=True)
class ListQuery:
    """Newest first (ids are ULIDs, so id order is creation order), or by name."""

    kind: str
    # None: every namespace.
    namespaces: frozenset[str] | None = None
    state: str | None = None
    attrs: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    # Continue after this id (exclusive), in newest-first order.
    before_id: str | None = None
    limit: int = 50
    # Registry order instead: named records by (namespace, name), after this pair.
    by_name: bool = False
    after_name: tuple[str, str] | None = None


class EventWakeups:
    """Wakes a process's event follower when another process may have appended events.

    Only a hint: the events table stays the truth, and the follower also reads it when a
    wait times out, so a lost wake-up costs latency, never an event. ``wait`` runs on the
    follower's own thread, never on an event loop. This default has no source: it sleeps
    (a pure poll); a backend overrides it with what it has (SQLite's ``data_version``,
    PostgreSQL's LISTEN)."""

    def __init__(self) -> None:
        self._closed = threading.Event()

    def wait(self, timeout: float) -> bool:
        """Block until events may have been appended since the previous wait (True; a
        spurious True is allowed) or ``timeout`` seconds passed (False)."""
        self._closed.wait(timeout)
        return False

    def close(self) -> None:
        """Release what the wake-ups hold; a wait in progress returns soon."""
        self._closed.set()


class StoreObserver(Protocol):
    """Told how long the store's work takes, from its own threads (so it must be cheap and
    thread-safe): the server's metrics attach here (``acp_store_*``); the store knows none."""

    def committed(self, seconds: float) -> None:
        """One commit (a group of write calls) took ``seconds``, from BEGIN to durable."""

    def waited(self, access: str, seconds: float) -> None:
        """A call (``access`` "read" or "write") waited ``seconds`` for its store thread,
        and a write for the write lock, before its function ran."""


class Store(abc.ABC):
    # Set by whoever assembles the server (``observe``); None: nobody is told.
    observer: StoreObserver | None = None

    def observe(self, observer: StoreObserver | None) -> None:
        """Report commit and wait times to ``observer`` from now on (None: stop)."""
        self.observer = observer

    # the event loop's interface --------------------------------------------------------

    @abc.abstractmethod
    async def read(self, fn: Callable[[Store], T]) -> T:
        """``fn(store)`` on a reader thread, in one read transaction: every read it makes
        sees the same snapshot, and none waits for a writer."""

    @abc.abstractmethod
    async def write(self, fn: Callable[[Store], T]) -> T:
        """``fn(store)`` on the writer thread, in a transaction committed with the others
        queued meanwhile (group commit); returns once the commit is durable and its
        ``after_commit`` callbacks ran (on the caller's loop, in commit order). If ``fn``
        raises, its writes are rolled back and the exception is raised here; a write lock
        held elsewhere longer than the store's bound raises StoreBusyError."""

    # synchronous: on a store thread inside read()/write(), or blocking the caller ------

    @abc.abstractmethod
    def transaction(self) -> AbstractContextManager[None]:
        """Group writes atomically; nested use joins the outer transaction."""

    @abc.abstractmethod
    def after_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` once the outermost open transaction commits (at once when none
        is open); dropped on rollback. Callbacks run in commit order, before any later
        transaction commits, so the event log can fan out in sequence order."""

    @abc.abstractmethod
    def get(self, kind: str, id: str) -> Record | None: ...

    @abc.abstractmethod
    def get_by_name(self, kind: str, namespace: str, name: str) -> Record | None: ...

    @abc.abstractmethod
    def insert(self, record: Record) -> None:
        """Raises StoreConflictError on a duplicate id or (kind, namespace, name)."""

    @abc.abstractmethod
    def update(self, record: Record, expected_revision: int | None = None) -> None:
        """Replace a record; raises StaleRevisionError when it is not at expected_revision,
        KeyError when it does not exist."""

    @abc.abstractmethod
    def delete(self, kind: str, id: str, expected_revision: int | None = None) -> bool: ...

    @abc.abstractmethod
    def query(self, query: ListQuery) -> list[Record]: ...

    @abc.abstractmethod
    def iter_kind(self, kind: str, namespace: str | None = None) -> Iterator[Record]:
        """Every record of a kind (for reference checks and restart recovery)."""

    @abc.abstractmethod
    def append_items(self, collection: str, owner_id: str, bodies: Sequence[bytes]) -> list[int]:
        """Append ordered child rows; returns their indices (from 0 per owner)."""

    @abc.abstractmethod
    def put_items(self, collection: str, owner_id: str, items: Mapping[int, bytes]) -> None:
        """Replace (or add) the child rows at these indices, touching no other row: what
        lets a plan record one step's change in O(1), not rewrite every step."""

    @abc.abstractmethod
    def list_items(self, collection: str, owner_id: str) -> list[tuple[int, bytes]]: ...

    @abc.abstractmethod
    def delete_items(self, collection: str, owner_id: str) -> None: ...

    @abc.abstractmethod
    def append_events(self, events: Sequence[StoredEvent]) -> list[int]:
        """Append in one transaction; the store assigns global, gap-free sequences."""

    @abc.abstractmethod
    def read_events(
        self, after_sequence: int, limit: int, where: EventFilter | None = None
    ) -> list[StoredEvent]:
        """Up to ``limit`` events after a sequence, matching ``where``, in sequence order."""

    @abc.abstractmethod
    def last_sequence(self) -> int:
        """The newest sequence ever assigned (0 for an empty log)."""

    @abc.abstractmethod
    def first_sequence(self) -> int:
        """The oldest retained sequence (0 for an empty log)."""

    @abc.abstractmethod
    def prune_events(self, *, keep_last: int | None = None, older_than: float | None = None) -> int:
        """Retention: drop events beyond the newest ``keep_last`` or older than a time
        (seconds since the epoch); returns how many went. The newest event always stays,
        so sequences never restart."""

    def event_wakeups(self) -> EventWakeups:
        """A wake-up source for one follower of the event log (see EventWakeups)."""
        return EventWakeups()

    @abc.abstractmethod
    def close(self) -> None: ...
