"""The versioned PostgreSQL schema, the twin of ``migrations.py``: steps only ever append,
each runs in its own transaction (PostgreSQL's DDL is transactional) together with the
version row, under an advisory lock so replicas starting together migrate once.

Text columns compare bytewise (``COLLATE "C"``), as SQLite's do: ids are ULIDs, and a
cursor of (namespace, name) pages the same on either backend.
"""

from __future__ import annotations

PG_MIGRATIONS: tuple[str, ...] = (
    # 1: records, items, the event log and its sequence counter.
    """
    CREATE TABLE records (
        kind TEXT COLLATE "C" NOT NULL,
        id TEXT COLLATE "C" NOT NULL,
        namespace TEXT COLLATE "C" NOT NULL,
        name TEXT COLLATE "C",
        revision BIGINT NOT NULL,
        state TEXT COLLATE "C" NOT NULL DEFAULT '',
        attrs JSONB NOT NULL DEFAULT '{}',
        labels JSONB NOT NULL DEFAULT '{}',
        create_time DOUBLE PRECISION NOT NULL,
        update_time DOUBLE PRECISION NOT NULL,
        body BYTEA NOT NULL,
        PRIMARY KEY (kind, id)
    );
    CREATE UNIQUE INDEX records_by_name ON records (kind, namespace, name) WHERE name IS NOT NULL;
    CREATE INDEX records_by_namespace ON records (kind, namespace, id);
    CREATE INDEX records_by_state ON records (kind, state, id);
    CREATE INDEX records_attrs ON records USING GIN (attrs jsonb_path_ops);
    CREATE INDEX records_labels ON records USING GIN (labels jsonb_path_ops);
    CREATE TABLE items (
        collection TEXT COLLATE "C" NOT NULL,
        owner_id TEXT COLLATE "C" NOT NULL,
        idx BIGINT NOT NULL,
        body BYTEA NOT NULL,
        PRIMARY KEY (collection, owner_id, idx)
    );
    CREATE TABLE events (
        sequence BIGINT PRIMARY KEY,
        namespace TEXT COLLATE "C" NOT NULL,
        type TEXT COLLATE "C" NOT NULL,
        plan_id TEXT COLLATE "C" NOT NULL DEFAULT '',
        session_id TEXT COLLATE "C" NOT NULL DEFAULT '',
        time DOUBLE PRECISION NOT NULL,
        body BYTEA NOT NULL
    );
    CREATE INDEX events_by_plan ON events (plan_id, sequence) WHERE plan_id <> '';
    CREATE INDEX events_by_session ON events (session_id, sequence) WHERE session_id <> '';
    CREATE INDEX events_by_time ON events (time);
    -- The newest sequence ever assigned. Appending updates this one row, so its lock is
    -- held until the appending transaction ends: sequences are handed out in commit
    -- order and a rollback gives them back (docs/events.md, "Across replicas").
    CREATE TABLE event_sequence (
        one BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (one),
        last BIGINT NOT NULL
    );
    INSERT INTO event_sequence (one, last) VALUES (TRUE, 0);
    """,
    # 2: request ids (facade/store/requests.py), as migration 3 of the SQLite schema.
    """
    CREATE TABLE requests (
        principal TEXT COLLATE "C" NOT NULL,
        request_id TEXT COLLATE "C" NOT NULL,
        operation TEXT COLLATE "C" NOT NULL,
        digest BYTEA NOT NULL,
        owner TEXT COLLATE "C" NOT NULL,
        time DOUBLE PRECISION NOT NULL,
        answer BYTEA,
        error BOOLEAN NOT NULL DEFAULT FALSE,
        written BYTEA NOT NULL,
        PRIMARY KEY (principal, request_id)
    );
    CREATE INDEX requests_by_time ON requests (time);
    """,
    # 3: leases (plan execution owned by one replica until its lease expires, on the
    # database's clock; ``token`` fences a holder's writes: facade/store/base.py), as
    # migration 4 of the SQLite schema.
    """
    CREATE TABLE leases (
        name TEXT COLLATE "C" PRIMARY KEY,
        owner TEXT NOT NULL DEFAULT '',
        token BIGINT NOT NULL DEFAULT 0,
        expires DOUBLE PRECISION NOT NULL DEFAULT 0,
        request TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX leases_held ON leases (expires) WHERE owner <> '';
    """,
)
