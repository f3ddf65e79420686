"""The versioned SQLite schema. Migrations only ever append: an old database opens after
an upgrade by running the steps it has not seen, each in its own transaction."""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: records, items, events.
    """
    CREATE TABLE records (
        kind TEXT NOT NULL,
        id TEXT NOT NULL,
        namespace TEXT NOT NULL,
        name TEXT,
        revision INTEGER NOT NULL,
        state TEXT NOT NULL DEFAULT '',
        attrs TEXT NOT NULL DEFAULT '{}',
        labels TEXT NOT NULL DEFAULT '{}',
        create_time REAL NOT NULL,
        update_time REAL NOT NULL,
        body BLOB NOT NULL,
        PRIMARY KEY (kind, id)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX records_by_name ON records (kind, namespace, name) WHERE name IS NOT NULL;
    CREATE INDEX records_by_namespace ON records (kind, namespace, id);
    CREATE TABLE items (
        collection TEXT NOT NULL,
        owner_id TEXT NOT NULL,
        idx INTEGER NOT NULL,
        body BLOB NOT NULL,
        PRIMARY KEY (collection, owner_id, idx)
    ) WITHOUT ROWID;
    CREATE TABLE events (
        sequence INTEGER PRIMARY KEY,
        namespace TEXT NOT NULL,
        type TEXT NOT NULL,
        plan_id TEXT NOT NULL DEFAULT '',
        session_id TEXT NOT NULL DEFAULT '',
        time REAL NOT NULL,
        body BLOB NOT NULL
    );
    CREATE INDEX events_by_plan ON events (plan_id, sequence) WHERE plan_id != '';
    CREATE INDEX events_by_session ON events (session_id, sequence) WHERE session_id != '';
    """,
    # 2: what lists filter on (state, attrs, labels) as indexed rows, so a first page is
    # O(page) (facade/store/sqlite_lists.py).
    """
    CREATE TABLE record_tags (
        kind TEXT NOT NULL,
        key TEXT NOT NULL,
        value TEXT NOT NULL,
        namespace TEXT NOT NULL,
        id TEXT NOT NULL,
        PRIMARY KEY (kind, key, value, namespace, id)
    ) WITHOUT ROWID;
    CREATE INDEX record_tags_by_value ON record_tags (kind, key, value, id);
    INSERT INTO record_tags SELECT kind, 's', state, namespace, id FROM records WHERE state != '';
    INSERT INTO record_tags
        SELECT r.kind, 'a:' || j.key, j.value, r.namespace, r.id FROM records r, json_each(r.attrs) j
        WHERE j.type = 'text' AND j.value != '';
    INSERT INTO record_tags
        SELECT r.kind, 'l:' || j.key, j.value, r.namespace, r.id FROM records r, json_each(r.labels) j
        WHERE j.type = 'text';
    """,
    # 3: request ids (facade/store/requests.py): the first answer of a mutating call per
    # (principal, request_id), stamped in the transaction of the call's effect.
    """
    CREATE TABLE requests (
        principal TEXT NOT NULL,
        request_id TEXT NOT NULL,
        operation TEXT NOT NULL,
        digest BLOB NOT NULL,
        owner TEXT NOT NULL,
        time REAL NOT NULL,
        answer BLOB,
        error INTEGER NOT NULL DEFAULT 0,
        written BLOB NOT NULL,
        PRIMARY KEY (principal, request_id)
    ) WITHOUT ROWID;
    CREATE INDEX requests_by_time ON requests (time);
    """,
    # 4: leases (plan execution owned by one process until its lease expires, on the store's
    # clock; ``token`` fences a holder's writes: facade/store/base.py, docs/plans.md).
    """
    CREATE TABLE leases (
        name TEXT PRIMARY KEY,
        owner TEXT NOT NULL DEFAULT '',
        token INTEGER NOT NULL DEFAULT 0,
        expires REAL NOT NULL DEFAULT 0,
        request TEXT NOT NULL DEFAULT ''
    ) WITHOUT ROWID;
    CREATE INDEX leases_held ON leases (expires) WHERE owner != '';
    """,
    # 5: no index on requests.time. Each commit under a request id wrote its page as one
    # more WAL frame (of about 3 the request row costs; ~10 µs of CPU each with the fsync);
    # retention sweeps the table in key order instead (``SQLiteStore.sweep_requests``).
    """
    DROP INDEX IF EXISTS requests_by_time;
    """,
)
