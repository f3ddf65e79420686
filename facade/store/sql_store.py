"""What both SQL stores do the same way: point and kind reads of records, items, the event
log's reads and retention, request ids and leases.

Each store runs these over its own ``_one``, ``_all``, ``_count`` and ``transaction`` (its
connections and transactions are its own) and its statements (``statements.py``); a
method here leaves a hook where the backends differ: ``_locked`` (a read inside a write
locks what it reads, on PostgreSQL), ``_list_statement`` (how a list finds its page),
``_fenced_lease`` (how the fence holds claimants off) and the codec of record maps.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from cleveragents.acp.facade.store import rows
from cleveragents.acp.facade.store.base import (
    EventFilter,
    Lease,
    LeaseHeldError,
    LeaseLostError,
    ListQuery,
    Record,
    Store,
)
from cleveragents.acp.facade.store.requests import RequestEntry
from cleveragents.acp.facade.store.statements import Statements


class SQLStore(Store):
    sql: ClassVar[Statements]
    # How the attrs and labels columns are read back (``rows.record``'s ``maps``).
    read_maps: Callable[[Any], Any]

    @abc.abstractmethod
    def _one(self, statement: str, params: Sequence[Any] = ()) -> Any:
        """One statement's first row (None: none), where the store runs it now."""

    @abc.abstractmethod
    def _all(self, statement: str, params: Sequence[Any] = ()) -> list[Any]:
        """One statement's rows."""

    @abc.abstractmethod
    def _count(self, statement: str, params: Sequence[Any] = ()) -> int:
        """One statement's count of rows changed."""

    def _locked(self, statement: str) -> str:
        """A record read as this transaction runs it (PostgreSQL locks it in a write)."""
        return statement

    @abc.abstractmethod
    def _list_statement(self, query: ListQuery) -> tuple[str, list[Any]] | None:
        """``query``'s page: its statement and parameters; None when it can match nothing."""

    @abc.abstractmethod
    def _fenced_lease(self, name: str, token: int | None) -> Lease | None:
        """In ``check_lease``'s transaction: the lease, read so that nobody may claim it
        until this transaction ends."""

    # records and items ------------------------------------------------------------------

    def get(self, kind: str, id: str) -> Record | None:
        row = self._one(self._locked(self.sql.get), (kind, id))
        return rows.record(row, self.read_maps) if row else None

    def get_by_name(self, kind: str, namespace: str, name: str) -> Record | None:
        row = self._one(self._locked(self.sql.get_by_name), (kind, namespace, name))
        return rows.record(row, self.read_maps) if row else None

    def query(self, query: ListQuery) -> list[Record]:
        statement = self._list_statement(query)
        if statement is None:
            return []
        maps = self.read_maps
        return [rows.record(row, maps) for row in self._all(*statement)]

    def iter_kind(self, kind: str, namespace: str | None = None) -> Iterator[Record]:
        if namespace is None:
            found = self._all(self.sql.kind, (kind,))
        else:
            found = self._all(self.sql.kind_in, (kind, namespace))
        maps = self.read_maps
        return iter([rows.record(row, maps) for row in found])

    def list_items(self, collection: str, owner_id: str) -> list[tuple[int, bytes]]:
        return rows.items(self._all(self.sql.items, (collection, owner_id)))

    # events -----------------------------------------------------------------------------

    def _events(self, columns: str, after_sequence: int, limit: int, where: EventFilter | None) -> list[Any]:
        """The rows of ``columns`` of the events ``read_events`` answers."""
        dialect = self.sql.dialect
        param = dialect.param
        clauses = [f"sequence > {param}"]
        params: list[Any] = [after_sequence]
        if where is not None:
            if where.namespaces is not None:
                if not where.namespaces:
                    return []
                clause, values = dialect.one_of("namespace", sorted(where.namespaces))
                clauses.append(clause)
                params.extend(values)
            for column, value in (("plan_id", where.plan_id), ("session_id", where.session_id)):
                if value:
                    # The literal term is what lets the store use the partial index
                    # events_by_plan/events_by_session: resuming one plan or session from
                    # sequence 0 then reads its events, not the whole log.
                    clauses.append(f"{column} = {param} AND {column} <> ''")
                    params.append(value)
            if where.types:
                clause, values = dialect.one_of("type", sorted(where.types))
                clauses.append(clause)
                params.extend(values)
        params.append(limit)
        return self._all(
            f"SELECT {columns} FROM events WHERE {' AND '.join(clauses)} ORDER BY sequence LIMIT {param}",
            params,
        )

    def first_sequence(self) -> int:
        return int(self._one(self.sql.first_sequence)[0])

    def prune_events(self, *, keep_last: int | None = None, older_than: float | None = None) -> int:
        with self.transaction():
            last = self.last_sequence()
            removed = 0
            if keep_last is not None:
                removed += self._count(self.sql.prune_events_before, (last - max(keep_last, 1),))
            if older_than is not None:
                removed += self._count(self.sql.prune_events_older, (older_than, last))
            return removed

    # request ids ------------------------------------------------------------------------

    def stamp_request(self, entry: RequestEntry, cutoff: float) -> bool:
        return self._put_request(entry, cutoff, answer=False)

    def answer_request(self, entry: RequestEntry, cutoff: float) -> bool:
        return self._put_request(entry, cutoff, answer=True)

    def _put_request(self, entry: RequestEntry, cutoff: float, *, answer: bool) -> bool:
        with self.transaction():
            return self._count(self.sql.put_request, rows.request_params(entry, cutoff, answer=answer)) > 0

    def get_request(self, principal: str, request_id: str) -> RequestEntry | None:
        row = self._one(self.sql.get_request, (principal, request_id))
        return None if row is None else rows.request(principal, request_id, row)

    def prune_requests(self, older_than: float) -> int:
        with self.transaction():
            return self._count(self.sql.prune_requests, (older_than,))

    # leases -----------------------------------------------------------------------------

    def store_time(self) -> float:
        return float(self._one(self.sql.store_time)[0])

    def get_lease(self, name: str) -> Lease | None:
        row = self._one(self.sql.get_lease, (name,))
        return rows.lease(row) if row else None

    def held_leases(self, prefix: str, limit: int) -> list[Lease]:
        return [rows.lease(row) for row in self._all(self.sql.held_leases, (len(prefix), prefix, limit))]

    def claim_lease(
        self, name: str, owner: str, ttl: float, *, steal_token: int | None = None
    ) -> Lease | None:
        """The row exists first, so the conditional UPDATE always has one: no other claimant
        comes between the look and the update (SQLite: BEGIN IMMEDIATE holds every other
        writer off; PostgreSQL: a second claimant waits for the row's lock until the first
        commits, then finds the lease held, as READ COMMITTED re-checks the WHERE)."""
        with self.transaction():
            self._count(self.sql.make_lease, (name,))
            stolen = -1 if steal_token is None else steal_token
            row = self._one(self.sql.claim_lease, (owner, ttl, name, stolen))
            return rows.lease(row) if row else None

    def renew_leases(self, owner: str, tokens: Mapping[str, int], ttl: float) -> dict[str, str]:
        """In name order: every transaction renewing several leases locks their rows in one
        order (PostgreSQL), so two never wait for each other."""
        renewed: dict[str, str] = {}
        with self.transaction():
            for name, token in sorted(tokens.items()):
                row = self._one(self.sql.renew_lease, (ttl, name, owner, token))
                if row is not None:
                    renewed[name] = row[0]
        return renewed

    def release_lease(self, name: str, token: int) -> bool:
        with self.transaction():
            return self._one(self.sql.release_lease, (name, token)) is not None

    def check_lease(self, name: str, token: int | None) -> Lease | None:
        with self.transaction():
            lease = self._fenced_lease(name, token)
        if token is None:
            if lease is not None and lease.live:
                raise LeaseHeldError(lease)
        elif lease is None or lease.token != token or not lease.live:
            raise LeaseLostError(name, token, lease)
        return lease

    def request_lease(self, name: str, request: str) -> bool:
        with self.transaction():
            return self._one(self.sql.request_lease, (request, name)) is not None
