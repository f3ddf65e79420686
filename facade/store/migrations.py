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
)
