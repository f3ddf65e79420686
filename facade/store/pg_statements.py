"""The statements only the PostgreSQL store runs, beside those both stores run
(``statements.py``): a record's insert, which the loop sends too, and a list's page."""

from __future__ import annotations

from typing import Any

from psycopg.types.json import Jsonb

from cleveragents.acp.facade.store import rows
from cleveragents.acp.facade.store.base import ListQuery, Record, StoreConflictError
from cleveragents.acp.facade.store.statements import POSTGRES, Statements

SQL = Statements(POSTGRES)
# ON CONFLICT DO NOTHING (every unique index): a clash leaves the transaction usable, as
# SQLite's does, for callers that catch StoreConflictError and go on.
INSERT = (
    f"INSERT INTO records ({rows.COLUMNS}) VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s) ON CONFLICT DO NOTHING"
)


def insert_params(record: Record) -> tuple[Any, ...]:
    return rows.record_params(record, Jsonb)


def clash(record: Record) -> StoreConflictError:
    return StoreConflictError(
        f"a {record.kind} with id {record.id} or name {record.name!r} exists in {record.namespace!r}"
    )


def query_statement(query: ListQuery) -> tuple[str, list[Any]] | None:
    """``query``'s statement and parameters; None when it can match nothing."""
    where = ["kind = %s"]
    params: list[Any] = [query.kind]
    if query.namespaces is not None:
        if not query.namespaces:
            return None
        where.append("namespace = ANY(%s::text[])")
        params.append(sorted(query.namespaces))
    if query.state:
        where.append("state = %s")
        params.append(query.state)
    if query.attrs:
        where.append("attrs @> %s")
        params.append(Jsonb(dict(query.attrs)))
    if query.labels:
        where.append("labels @> %s")
        params.append(Jsonb(dict(query.labels)))
    if query.by_name:
        where.append("name IS NOT NULL")
        if query.after_name is not None:
            where.append("(namespace, name) > (%s, %s)")
            params.extend(query.after_name)
        order = "namespace, name"
    else:
        if query.before_id:
            where.append("id < %s")
            params.append(query.before_id)
        order = "id DESC"
    params.append(query.limit)
    return f"SELECT {rows.COLUMNS} FROM records WHERE {' AND '.join(where)} ORDER BY {order} LIMIT %s", params
