"""The statements both SQL stores run, written once.

SQLite and PostgreSQL run the same statements on the same tables but for what their
dialects spell apart (``Dialect``): the placeholder (``?``; psycopg's ``%s``), the store's
clock, and a parameter that is a list of values. The texts here are written with ``?``;
``Statements(dialect)`` is one store's set. A statement only one backend runs lives in its
module (``sqlite.py``, ``postgres.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cleveragents.acp.facade.store.rows import COLUMNS, REQUEST_COLUMNS


@dataclass(frozen=True)
class Dialect:
    # The placeholder of one parameter.
    param: str
    # The store's clock in seconds since the epoch, the database's own, never the caller's.
    now: str
    # Whether a list of values binds as one array parameter (else one placeholder each).
    arrays: bool

    def sql(self, text: str) -> str:
        """``text`` (written with ``?``) in this dialect. A ``%`` would need escaping for
        psycopg, so a shared statement has none."""
        if "%" in text:
            raise ValueError(f"a shared statement holds a '%': {text}")
        return text.replace("?", self.param)

    def one_of(self, column: str, values: Sequence[str]) -> tuple[str, list[Any]]:
        """A condition that ``column`` is one of ``values`` (not empty), and its parameters."""
        if self.arrays:
            return f"{column} = ANY({self.param}::text[])", [list(values)]
        return f"{column} IN ({','.join([self.param] * len(values))})", list(values)


# SQLite's 'now' is one value per statement.
SQLITE = Dialect(param="?", now="((julianday('now') - 2440587.5) * 86400.0)", arrays=False)
# clock_timestamp: the time now, not the transaction's start, so a long transaction does not
# see a lease as younger.
POSTGRES = Dialect(param="%s", now="extract(epoch FROM clock_timestamp())::double precision", arrays=True)


class Statements:
    """The shared statements in one dialect."""

    def __init__(self, dialect: Dialect) -> None:
        sql, now = dialect.sql, dialect.now
        self.dialect = dialect
        # records and items
        self.get = sql(f"SELECT {COLUMNS} FROM records WHERE kind = ? AND id = ?")
        self.get_by_name = sql(f"SELECT {COLUMNS} FROM records WHERE kind = ? AND namespace = ? AND name = ?")
        self.kind = sql(f"SELECT {COLUMNS} FROM records WHERE kind = ? ORDER BY id")
        self.kind_in = sql(f"SELECT {COLUMNS} FROM records WHERE kind = ? AND namespace = ? ORDER BY id")
        self.items = sql("SELECT idx, body FROM items WHERE collection = ? AND owner_id = ? ORDER BY idx")
        self.delete_items = sql("DELETE FROM items WHERE collection = ? AND owner_id = ?")
        # events
        self.first_sequence = "SELECT COALESCE(MIN(sequence), 0) FROM events"
        self.prune_events_before = sql("DELETE FROM events WHERE sequence <= ?")
        self.prune_events_older = sql("DELETE FROM events WHERE time < ? AND sequence < ?")
        # request ids: insert a row, or replace it when it is the same claim's or past retention
        self.put_request = sql(
            "INSERT INTO requests (principal, request_id, operation, digest, owner, time, answer, error, "
            "written) VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT (principal, request_id) DO UPDATE SET "
            "operation=excluded.operation, digest=excluded.digest, owner=excluded.owner, "
            "time=excluded.time, answer=excluded.answer, error=excluded.error, written=excluded.written "
            "WHERE requests.owner = excluded.owner OR requests.time < ?"
        )
        self.get_request = sql(
            f"SELECT {REQUEST_COLUMNS} FROM requests WHERE principal = ? AND request_id = ?"
        )
        self.prune_requests = sql("DELETE FROM requests WHERE time < ?")
        # leases, on the store's clock
        self.store_time = f"SELECT {now}"
        self.lease = f"name, owner, token, expires, expires > {now}, request"
        self.get_lease = sql(f"SELECT {self.lease} FROM leases WHERE name = ?")
        self.held_leases = sql(
            f"SELECT {self.lease} FROM leases WHERE owner <> '' AND substr(name, 1, ?) = ? "
            "ORDER BY expires LIMIT ?"
        )
        self.make_lease = sql("INSERT INTO leases (name) VALUES (?) ON CONFLICT (name) DO NOTHING")
        self.claim_lease = sql(
            f"UPDATE leases SET owner = ?, token = token + 1, expires = {now} + ?, request = '' "
            f"WHERE name = ? AND (owner = '' OR expires <= {now} OR token = ?) RETURNING {self.lease}"
        )
        self.renew_lease = sql(
            f"UPDATE leases SET expires = {now} + ? "
            "WHERE name = ? AND owner = ? AND token = ? RETURNING request"
        )
        self.release_lease = sql(
            "UPDATE leases SET owner = '', expires = 0, request = '' "
            "WHERE name = ? AND token = ? AND owner <> '' RETURNING name"
        )
        self.request_lease = sql(
            f"UPDATE leases SET request = ? WHERE name = ? AND owner <> '' AND expires > {now} RETURNING name"
        )
