"""How the SQLite store answers a list in O(page), however many records it holds.

A record's filterable values (its state, every non-empty attr, every label) are also rows
of ``record_tags`` (kind, key, value, namespace, id), indexed with the namespace before
the id (one namespace's matches, newest first: the primary key) and without it
(``record_tags_by_value``: every namespace's). A list runs one subquery per namespace it
may see, driven by the index of its most selective filter (a label, else an attr, else the
state, else the namespace alone), reading ids newest first and stopping at the page; the
other filters are checked on the rows it reads. Several namespaces' pages are merged by id.

So a first page costs what it reads: the page when the driving filter matches many, the
matches when it matches few. What stays proportional to the store is a conjunction whose
driving filter matches many rows that the other filters then refuse (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cleveragents.acp.facade.store.base import ListQuery, Record

STATE = "s"
ATTR = "a:"
LABEL = "l:"
# Beyond this many namespaces a list reads them together (IN) instead of one page each.
MAX_NAMESPACE_BRANCHES = 32


def tags(state: str, attrs: Mapping[str, str], labels: Mapping[str, str]) -> set[tuple[str, str]]:
    """The (key, value) pairs a record is found by."""
    found = {(ATTR + k, v) for k, v in attrs.items() if v}
    found.update((LABEL + k, v) for k, v in labels.items())
    if state:
        found.add((STATE, state))
    return found


def record_tags(record: Record) -> set[tuple[str, str]]:
    return tags(record.state, record.attrs, record.labels)


# Rows one multi-row INSERT takes at most: 256 of 11 values stay under SQLite's 32,766
# bound parameters, and there are as many statement texts to keep prepared.
MAX_ROWS = 256


@functools.cache
def insert_statement(head: str, width: int, count: int) -> str:
    """``head`` followed by ``count`` rows of ``width`` parameters."""
    row = "(" + ",".join("?" * width) + ")"
    return head + ",".join([row] * count)


def insert_rows(db: sqlite3.Connection, head: str, width: int, rows: Sequence[Sequence[Any]]) -> None:
    """``rows`` in one statement per MAX_ROWS, not one step per row (``executemany``): the
    sqlite3 module lets go of the GIL at every step, and on a busy server each let-go costs
    the writer thread a sleep and a wake-up."""
    for start in range(0, len(rows), MAX_ROWS):
        chunk = rows[start : start + MAX_ROWS]
        db.execute(insert_statement(head, width, len(chunk)), [value for row in chunk for value in row])


_ADD_TAGS = "INSERT OR IGNORE INTO record_tags (kind, key, value, namespace, id) VALUES "


def add_tags(
    db: sqlite3.Connection, kind: str, namespace: str, id: str, pairs: Iterable[tuple[str, str]]
) -> None:
    insert_rows(db, _ADD_TAGS, 5, [(kind, key, value, namespace, id) for key, value in pairs])


def add_records_tags(db: sqlite3.Connection, records: Iterable[Record]) -> None:
    """The tags of several new records, in one statement."""
    insert_rows(
        db,
        _ADD_TAGS,
        5,
        [(r.kind, key, value, r.namespace, r.id) for r in records for key, value in record_tags(r)],
    )


def drop_tags(
    db: sqlite3.Connection, kind: str, namespace: str, id: str, pairs: Iterable[tuple[str, str]]
) -> None:
    db.executemany(
        "DELETE FROM record_tags WHERE kind=? AND key=? AND value=? AND namespace=? AND id=?",
        [(kind, key, value, namespace, id) for key, value in pairs],
    )


def retag(
    db: sqlite3.Connection,
    kind: str,
    id: str,
    old: tuple[str, set[tuple[str, str]]],
    new: tuple[str, set[tuple[str, str]]],
) -> None:
    """Move a record's tags from (namespace, pairs) ``old`` to ``new``, touching only what
    changed (a plan saved at every step keeps its tags)."""
    (old_ns, old_pairs), (new_ns, new_pairs) = old, new
    if old_ns != new_ns:
        drop_tags(db, kind, old_ns, id, old_pairs)
        add_tags(db, kind, new_ns, id, new_pairs)
        return
    drop_tags(db, kind, old_ns, id, old_pairs - new_pairs)
    add_tags(db, kind, new_ns, id, new_pairs - old_pairs)


def _driver(query: ListQuery) -> tuple[str, str] | None:
    """The filter whose index leads: a label, else an attr, else the state."""
    for key, value in sorted(query.labels.items()):
        return LABEL + key, value
    for key, value in sorted(query.attrs.items()):
        if value:
            return ATTR + key, value
    if query.state:
        return STATE, query.state
    return None


def _branch(
    query: ListQuery, columns: str, namespace: str | None, namespaces: Sequence[str]
) -> tuple[str, list[Any]]:
    """One subquery: a namespace's (or every namespace's) page, newest first."""
    driver = _driver(query)
    where: list[str] = []
    params: list[Any] = []
    if driver is not None:
        source = "record_tags t CROSS JOIN records r ON r.kind = t.kind AND r.id = t.id"
        where.append("t.kind = ? AND t.key = ? AND t.value = ?")
        params.extend([query.kind, *driver])
        order = "t.id"
        if namespace is not None:
            where.append("t.namespace = ?")
            params.append(namespace)
        if query.before_id:
            where.append("t.id < ?")
            params.append(query.before_id)
    else:
        # Without INDEXED BY SQLite walks the whole kind by id to skip a sort.
        source = "records r" if namespace is None else "records r INDEXED BY records_by_namespace"
        where.append("r.kind = ?")
        params.append(query.kind)
        order = "r.id"
        if namespace is not None:
            where.append("r.namespace = ?")
            params.append(namespace)
        if query.before_id:
            where.append("r.id < ?")
            params.append(query.before_id)
    if namespace is None and namespaces:
        where.append(f"r.namespace IN ({','.join('?' * len(namespaces))})")
        params.extend(namespaces)
    if query.state and driver != (STATE, query.state):
        where.append("r.state = ?")
        params.append(query.state)
    for key, value in sorted(query.attrs.items()):
        if driver != (ATTR + key, value):
            where.append("json_extract(r.attrs, ?) = ?")
            params.extend([f'$."{key}"', value])
    for key, value in sorted(query.labels.items()):
        if driver != (LABEL + key, value):
            where.append("json_extract(r.labels, ?) = ?")
            params.extend([f'$."{key}"', value])
    params.append(query.limit)
    sql = f"SELECT {columns} FROM {source} WHERE {' AND '.join(where)} ORDER BY {order} DESC LIMIT ?"
    return sql, params


def _by_name(
    query: ListQuery, columns: str, namespace: str | None, namespaces: Sequence[str]
) -> tuple[str, list[Any]]:
    """One subquery of a list in (namespace, name) order: the name index walked from the
    cursor, or, with labels, the label's matches sorted."""
    where: list[str] = []
    params: list[Any] = []
    label = next(iter(sorted(query.labels.items())), None)
    if label is not None:
        source = "record_tags t CROSS JOIN records r ON r.kind = t.kind AND r.id = t.id"
        where.append("t.kind = ? AND t.key = ? AND t.value = ?")
        params.extend([query.kind, LABEL + label[0], label[1]])
        if namespace is not None:
            where.append("t.namespace = ?")
            params.append(namespace)
    else:
        source = "records r INDEXED BY records_by_name"
    where.append("r.kind = ? AND r.name IS NOT NULL")
    params.append(query.kind)
    after = query.after_name
    if namespace is not None:
        where.append("r.namespace = ?")
        params.append(namespace)
        if after is not None and after[0] == namespace:
            where.append("r.name > ?")
            params.append(after[1])
    elif after is not None:
        where.append("(r.namespace, r.name) > (?, ?)")
        params.extend(after)
    if namespace is None and namespaces:
        where.append(f"r.namespace IN ({','.join('?' * len(namespaces))})")
        params.extend(namespaces)
    if query.state:
        where.append("r.state = ?")
        params.append(query.state)
    for key, value in sorted(query.attrs.items()):
        where.append("json_extract(r.attrs, ?) = ?")
        params.extend([f'$."{key}"', value])
    for key, value in sorted(query.labels.items()):
        if (key, value) != label:
            where.append("json_extract(r.labels, ?) = ?")
            params.extend([f'$."{key}"', value])
    params.append(query.limit)
    sql = f"SELECT {columns} FROM {source} WHERE {' AND '.join(where)} ORDER BY r.namespace, r.name LIMIT ?"
    return sql, params


def select(query: ListQuery, columns: Sequence[str]) -> tuple[str, list[Any]] | None:
    """The statement (and parameters) of one page of ``query``; None when it is empty."""
    prefixed = ", ".join(f"r.{c}" for c in columns)
    branch = _by_name if query.by_name else _branch
    order = "namespace, name" if query.by_name else "id DESC"
    if query.namespaces is None:
        return branch(query, prefixed, None, ())
    namespaces = sorted(query.namespaces)
    if query.by_name and query.after_name is not None:
        # Namespaces before the cursor's are done.
        namespaces = [n for n in namespaces if n >= query.after_name[0]]
    if not namespaces:
        return None
    if len(namespaces) > MAX_NAMESPACE_BRANCHES:
        return branch(query, prefixed, None, namespaces)
    if len(namespaces) == 1:
        return branch(query, prefixed, namespaces[0], ())
    parts: list[str] = []
    params: list[Any] = []
    for namespace in namespaces:
        sql, branch_params = branch(query, prefixed, namespace, ())
        parts.append(f"SELECT * FROM ({sql})")
        params.extend(branch_params)
    params.append(query.limit)
    return f"{' UNION ALL '.join(parts)} ORDER BY {order} LIMIT ?", params
