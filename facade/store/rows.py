"""Rows to store objects and back, for both SQL stores: one column order, one decoding.

The backends differ only in how a record's ``attrs`` and ``labels`` travel: SQLite keeps
them as JSON text (``maps``: its codec), PostgreSQL as ``jsonb``, which its drivers hand
back decoded (``as_decoded``) and take wrapped (``Jsonb``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cleveragents.acp.facade.store.base import Lease, Record
from cleveragents.acp.facade.store.requests import RequestEntry, decode_written, encode_written

# A record's columns, in the order ``record`` reads and ``record_params`` writes them.
COLUMNS = "kind, id, namespace, name, revision, state, attrs, labels, create_time, update_time, body"
COLUMN_NAMES = tuple(COLUMNS.split(", "))
# An event's columns, in ``StoredEvent``'s order.
EVENT_COLUMNS = "sequence, namespace, type, plan_id, session_id, time, body"
# A request row's columns after its key (principal, request_id), as ``request`` reads them.
REQUEST_COLUMNS = "operation, digest, owner, time, answer, error, written"


def as_decoded(value: Any) -> Any:
    """A map column a driver already decoded (PostgreSQL's jsonb)."""
    return value


def record(row: Sequence[Any], maps: Callable[[Any], Any]) -> Record:
    """A row of ``COLUMNS``; ``maps`` decodes the attrs and labels columns."""
    kind, id_, namespace, name, revision, state, attrs, labels, created, updated, body = row
    return Record(
        kind=kind,
        id=id_,
        namespace=namespace,
        name=name,
        revision=revision,
        state=state,
        attrs=maps(attrs),
        labels=maps(labels),
        create_time=created,
        update_time=updated,
        body=bytes(body),
    )


def record_params(record: Record, maps: Callable[[dict[str, str]], Any]) -> tuple[Any, ...]:
    """An INSERT's values, in ``COLUMNS`` order; ``maps`` encodes attrs and labels."""
    return (
        record.kind,
        record.id,
        *_changing(record, maps),
        record.create_time,
        record.update_time,
        record.body,
    )


def update_params(record: Record, maps: Callable[[dict[str, str]], Any]) -> tuple[Any, ...]:
    """An UPDATE's values: namespace, name, revision, state, attrs, labels, update_time and
    body set, then kind and id for its WHERE."""
    return (*_changing(record, maps), record.update_time, record.body, record.kind, record.id)


def _changing(record: Record, maps: Callable[[dict[str, str]], Any]) -> tuple[Any, ...]:
    """The values an update may change but its time and body, in ``COLUMNS`` order."""
    return (
        record.namespace,
        record.name,
        record.revision,
        record.state,
        maps(record.attrs),
        maps(record.labels),
    )


def items(rows: Iterable[Sequence[Any]]) -> list[tuple[int, bytes]]:
    """Rows of (idx, body)."""
    return [(int(idx), bytes(body)) for idx, body in rows]


def lease(row: Sequence[Any]) -> Lease:
    """A row of ``Statements.lease`` columns: live only while it has an owner."""
    name, owner, token, expires, live, request = row
    return Lease(name, owner, int(token), float(expires), bool(live) and bool(owner), request)


def request(principal: str, request_id: str, row: Sequence[Any]) -> RequestEntry:
    """A row of ``REQUEST_COLUMNS`` for the key (principal, request_id)."""
    operation, digest, owner, time_, answer, error, written = row
    return RequestEntry(
        principal=principal,
        request_id=request_id,
        operation=operation,
        digest=bytes(digest),
        owner=owner,
        time=float(time_),
        answer=None if answer is None else bytes(answer),
        error=bool(error),
        written=decode_written(bytes(written)),
    )


def request_params(entry: RequestEntry, cutoff: float, *, answer: bool) -> tuple[Any, ...]:
    """``Statements.put_request``'s values: the entry (with its answer when ``answer``, else
    none yet), then the retention cutoff a row of another owner must be older than."""
    return (
        entry.principal,
        entry.request_id,
        entry.operation,
        entry.digest,
        entry.owner,
        entry.time,
        entry.answer if answer else None,
        bool(entry.error) if answer else False,
        encode_written(entry.written),
        cutoff,
    )
