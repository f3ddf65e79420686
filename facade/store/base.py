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
import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol, TypeVar

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.store.requests import CLAIM, RequestClaimedError, RequestEntry

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

    def __init__(self, waited: float, why: str = "the database stayed locked by another process") -> None:
        super().__init__(
            ErrorCode.BUDGET_EXCEEDED,
            f"{why} for {waited:.1f} s, so nothing was written; retry the call",
            {"retryable": True, "waited_seconds": round(waited, 3)},
            refinement="STORE_BUSY",
        )


# A store whose disk was full is writable again once this much more is free (or, where it
# cannot tell, this long after): readiness stops refusing and the next write tells.
FULL_MARGIN_BYTES = 1 << 20
FULL_RECHECK_SECONDS = 5.0


class StoreDownError(ACPError):
    """The database cannot be reached (a PostgreSQL restart or failover, a lost connection):
    INTERNAL_ERROR, refinement ``STORE_UNAVAILABLE``, retryable. A call cut while committing
    may have committed; its retry with the same request id is answered from its stamp, so
    retrying never acts twice (docs/idempotency.md)."""

    def __init__(self, cause: str) -> None:
        super().__init__(
            ErrorCode.INTERNAL_ERROR,
            f"the database cannot be reached ({cause}); retry the call with the same request id",
            {"retryable": True, "cause": cause},
            refinement="STORE_UNAVAILABLE",
        )


class StoreFullError(ACPError):
    """The database's disk is full: nothing of the call was written. BUDGET_EXCEEDED,
    refinement ``STORE_DISK_FULL``, not retryable: another attempt fails the same way until
    an operator frees space (``/readyz`` says not ready meanwhile)."""

    def __init__(self, where: str) -> None:
        super().__init__(
            ErrorCode.BUDGET_EXCEEDED,
            f"the database's disk is full ({where}): nothing was written; writes fail until space is freed",
            {"retryable": False, "effect": "none"},
            refinement="STORE_DISK_FULL",
        )


class StaleRevisionError(Exception):
    """The record is not at the revision the writer read."""

    def __init__(self, current: int) -> None:
        super().__init__(f"current revision is {current}")
        self.current = current


class LeaseLostError(Exception):
    """A fenced write was refused: the writer's lease token is no longer the current one,
    or its lease expired by the store's clock. Nothing of the transaction may be kept."""

    def __init__(self, name: str, token: int, current: Lease | None) -> None:
        super().__init__(f"lease {name!r} with token {token} is lost: {_since(token, current)}")
        self.name = name
        self.token = token
        self.current = current


def _since(token: int, current: Lease | None) -> str:
    """What became of a lease a writer held at ``token``: who holds it now, at which token."""
    if current is None:
        return "no such lease"
    if current.token == token:
        if not current.owner:
            return "it was released"
        return f"it expired unrenewed (holder {current.owner}, token {token}; nobody has claimed it since)"
    if not current.owner:
        return f"it was claimed since (token {current.token}) and released; nobody holds it"
    state = "live" if current.live else "expired"
    return f"now held by {current.owner} at token {current.token} ({state})"


class LeaseHeldError(Exception):
    """A write that holds no lease met a live one held by someone else."""

    def __init__(self, lease: Lease) -> None:
        super().__init__(f"lease {lease.name!r} is held by {lease.owner} (token {lease.token})")
        self.lease = lease


@dataclass(frozen=True)
class Lease:
    """Who may write for one named thing (a plan) until when, on the store's clock.

    ``token`` grows by one at every claim and never goes back (a released lease keeps its
    row and token): the fencing token a holder's writes are checked against."""

    name: str
    owner: str
    token: int
    # Seconds since the epoch on the store's clock; 0 once released.
    expires: float
    # Whether it had not expired when read (compared on the store's clock, not the caller's).
    live: bool
    # What someone asked of the holder (a cross-process cancel); '' for nothing.
    request: str = ""


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


class StoredEvent(NamedTuple):
    """A row of the event log. A tuple, not a frozen dataclass: a backlog read builds one
    per row on a reader thread, and a frozen dataclass's ``__init__`` (a checked
    ``object.__setattr__`` per field) cost that thread more than the row itself."""

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
    # The last write found the disk full: (when, bytes free then); None: writes succeed.
    full: tuple[float, int | None] | None = None

    # a full disk ------------------------------------------------------------------------

    def free_bytes(self) -> int | None:
        """Bytes free to the store where its database grows, when it can tell (SQLite)."""
        return None

    def note_full(self) -> None:
        """A write found the disk full (it raises StoreFullError): not writable from now.
        The space free is read when its caller is told, maybe after an operator freed some:
        while still full, the least read stays the mark, so a late one never raises it."""
        free, full = self.free_bytes(), self.full
        if free is not None and full is not None and full[1] is not None:
            free = min(free, full[1])
        self.full = (time.monotonic(), free)

    def check_writable(self) -> None:
        """Raises StoreFullError while the last write found the disk full and no space came
        free since (``FULL_MARGIN_BYTES``; where the store cannot tell, for
        ``FULL_RECHECK_SECONDS``): what ``/readyz`` asks, so a balancer sends no writes
        that cannot succeed. Any successful write clears it."""
        full = self.full
        if full is None:
            return
        when, free_then = full
        free = self.free_bytes()
        if free is not None and free_then is not None:
            if free >= free_then + FULL_MARGIN_BYTES:
                self.full = None
                return
        elif time.monotonic() - when >= FULL_RECHECK_SECONDS:
            self.full = None
            return
        raise StoreFullError(f"{free} bytes free" if free is not None else "the database said so")

    def observe(self, observer: StoreObserver | None) -> None:
        """Report commit and wait times to ``observer`` from now on (None: stop)."""
        self.observer = observer

    def read_cache_counts(self) -> tuple[int, int]:
        """Point reads answered from memory, and those that went to the database, so far
        (a store that keeps no answers: none of either)."""
        return 0, 0

    def outage(self, exc: BaseException) -> str | None:
        """One line saying the database cannot be reached now (a restart, a lost
        connection), when ``exc`` means that: background work that retries logs that line
        instead of a traceback. None for any other failure (a bug deserves the traceback)."""
        if isinstance(exc, StoreUnavailableError):
            return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, StoreDownError):
            return f"{type(exc).__name__}: {exc.details['cause']}"
        return None

    # the event loop's interface --------------------------------------------------------

    @abc.abstractmethod
    async def read(self, fn: Callable[[Store], T], *, urgent: bool = False) -> T:
        """``fn(store)`` on a reader thread, in one read transaction: every read it makes
        sees the same snapshot, and none waits for a writer. ``urgent``: handed to the
        reader at once, never held for a busy loop (``ReadLane.run``)."""

    @abc.abstractmethod
    async def write(self, fn: Callable[[Store], T]) -> T:
        """``fn(store)`` on the writer thread, in a transaction committed with the others
        queued meanwhile (group commit); returns once the commit is durable and its
        ``after_commit`` callbacks ran (on the caller's loop, in commit order). If ``fn``
        raises, its writes are rolled back and the exception is raised here; a write lock
        held elsewhere longer than the store's bound raises StoreBusyError."""

    # one-snapshot reads the loop awaits directly: what ``read`` gives for one call of the
    # method of the same name, which a store may answer without a thread (PostgreSQL) -----

    async def read_get(self, kind: str, id: str) -> Record | None:
        return await self.read(lambda store: store.get(kind, id))

    async def read_get_by_name(self, kind: str, namespace: str, name: str) -> Record | None:
        return await self.read(lambda store: store.get_by_name(kind, namespace, name))

    async def read_with_items(
        self, kind: str, id: str, collection: str
    ) -> tuple[Record | None, list[tuple[int, bytes]]]:
        return await self.read(lambda store: store.get_with_items(kind, id, collection))

    async def read_query(self, query: ListQuery) -> list[Record]:
        return await self.read(lambda store: store.query(query))

    async def read_items(self, collection: str, owner_id: str) -> list[tuple[int, bytes]]:
        return await self.read(lambda store: store.list_items(collection, owner_id))

    # a write the loop awaits directly: what ``write`` gives for one call of the method of
    # the same name with nothing read before it, which a store may do without a thread ----

    async def insert_alone(self, record: Record) -> None:
        """``insert`` in a transaction of its own."""
        await self.write(lambda store: store.insert(record))

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

    def get_with_items(
        self, kind: str, id: str, collection: str
    ) -> tuple[Record | None, list[tuple[int, bytes]]]:
        """``get(kind, id)`` and ``list_items(collection, id)`` together: a store that waits
        for its server once per statement (PostgreSQL) sends both at once in a read."""
        return self.get(kind, id), self.list_items(collection, id)

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

    def read_event_bodies(
        self, after_sequence: int, limit: int, where: EventFilter | None = None
    ) -> list[tuple[int, bytes]]:
        """``read_events``' sequences and bodies alone: all a subscriber's backlog decodes
        (a store reads two columns a row instead of seven)."""
        return [(event.sequence, event.body) for event in self.read_events(after_sequence, limit, where)]

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

    # request ids (facade/store/requests.py, docs/idempotency.md) ----------------------

    def note_claim(self, kind: str | None = None, id: str = "", body: bytes | None = None) -> None:
        """Called by every writing method inside its transaction: when a call runs under a
        request id (``CLAIM``), stamp its row in this same transaction, with the record
        ``(kind, id)`` as written (``body``; a deleted record's body as it was). Raises
        RequestClaimedError, rolling the write back, when another live claim owns the id."""
        claim = CLAIM.get()
        if claim is None or not claim.open:
            return
        if kind is not None and body is not None:
            written = claim.entry.written
            written.pop((kind, id), None)
            written[(kind, id)] = body
        if not self.stamp_request(claim.entry, claim.cutoff):
            claim.conflict = True
            raise RequestClaimedError(f"request id {claim.entry.request_id!r} is another run's")
        claim.stamped = True

    @abc.abstractmethod
    def stamp_request(self, entry: RequestEntry, cutoff: float) -> bool:
        """In the current write transaction: insert ``entry`` (no answer), or replace the
        row of the same (principal, request_id) when it has the same owner or is older than
        ``cutoff``; False (nothing written) when another owner's live row is there."""

    @abc.abstractmethod
    def answer_request(self, entry: RequestEntry, cutoff: float) -> bool:
        """Store ``entry`` with its answer, under the same rule as ``stamp_request``."""

    @abc.abstractmethod
    def get_request(self, principal: str, request_id: str) -> RequestEntry | None: ...

    @abc.abstractmethod
    def prune_requests(self, older_than: float) -> int:
        """Retention: drop rows whose run started before ``older_than``; how many went."""

    def sweep_requests(
        self, older_than: float, after: tuple[str, str] | None, limit: int
    ) -> tuple[int, tuple[str, str] | None]:
        """Retention in steps, for a store without an index on the rows' time: drop the rows
        past ``older_than`` among the ``limit`` rows after the key ``after`` (principal,
        request_id; None: the first); (how many went, the key the next step starts after,
        None once this pass reached the last row). By default one step prunes every row."""
        return self.prune_requests(older_than), None

    # leases: on the store's clock, so replicas whose clocks differ agree on expiry --------

    @abc.abstractmethod
    def store_time(self) -> float:
        """The store's clock (seconds since the epoch): the database server's, not ours."""

    @abc.abstractmethod
    def get_lease(self, name: str) -> Lease | None: ...

    @abc.abstractmethod
    def held_leases(self, prefix: str, limit: int) -> list[Lease]:
        """Leases with an owner (live or expired) whose name starts with ``prefix``, the
        soonest to expire first: what a takeover scanner looks at."""

    @abc.abstractmethod
    def claim_lease(
        self, name: str, owner: str, ttl: float, *, steal_token: int | None = None
    ) -> Lease | None:
        """Take the lease if it is free or expired (or still at ``steal_token``, a holder the
        caller knows is dead), for ``ttl`` seconds, with the next token; None when someone
        else holds it. A conditional update inside the current write transaction."""

    @abc.abstractmethod
    def renew_leases(self, owner: str, tokens: Mapping[str, int], ttl: float) -> dict[str, str]:
        """Extend every lease still at its token (even one just expired that nobody has
        claimed since: no other writer can have been fenced in) by ``ttl`` from now; returns
        name -> pending request for those renewed. A name missing from the answer is lost."""

    @abc.abstractmethod
    def release_lease(self, name: str, token: int) -> bool:
        """Free the lease if it is still at ``token``; the token stays for the next claim."""

    @abc.abstractmethod
    def check_lease(self, name: str, token: int | None) -> Lease | None:
        """The fence, called inside the write transaction it guards. With a token: raise
        LeaseLostError unless the lease is at that token and live. Without: raise
        LeaseHeldError if anyone holds it live. Either way nobody may claim the lease
        until this transaction ends. Returns the lease (None, or a free one at token 0, if
        nobody ever held it)."""

    @abc.abstractmethod
    def request_lease(self, name: str, request: str) -> bool:
        """Leave a request (a cancel) for the holder of a live lease; False if none holds it."""

    @abc.abstractmethod
    def close(self) -> None:
        """Commit what is queued, stop the store's threads, close its connections: it
        waits for them, so never on an event loop (``aclose`` is the loop's)."""

    async def aclose(self) -> None:
        """``close`` on a worker thread: the loop goes on serving (and answering the writes
        the close commits) while the writer finishes and the threads are joined."""
        await asyncio.to_thread(self.close)
