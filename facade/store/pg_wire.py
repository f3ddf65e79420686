"""The PostgreSQL store's statements straight through libpq, prepared once per connection.

psycopg's ``Connection.execute`` costs about 100 µs of Python per statement (a cursor, the
adaptation machinery, a generator-driven wait); the store runs a handful of fixed statements
with plain parameters, and libpq's own ``PQexecPrepared`` (which releases the GIL while it
waits) does the same work in about a fifth of that: a ``session.show`` read went from
150 µs to 30 µs of CPU, 600 µs to 250 µs of wall time, measured in a loop.

``run`` takes what the store passes (str, int, float, bool, bytes, None, a list of str, a
dict for jsonb) and returns rows decoded by column type; anything else is ``None``, and the
caller uses psycopg. Parameters go as text, bytes as binary; results come back binary.
"""

from __future__ import annotations

import struct
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

import orjson
import psycopg
from psycopg import errors, pq
from psycopg.types.json import Jsonb

_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
_DOUBLE = struct.Struct(">d")


def _int(raw: bytes) -> int:
    return int.from_bytes(raw, "big", signed=True)


def _text(raw: bytes) -> str:
    return raw.decode()


def _float(raw: bytes) -> float:
    value: float = _DOUBLE.unpack(raw)[0]
    return value


def _jsonb(raw: bytes) -> Any:
    # Binary jsonb: a version byte, then the JSON text.
    return orjson.loads(raw[1:])


def _bytes(raw: bytes) -> bytes:
    return bytes(raw)


def _bool(raw: bytes) -> bool:
    return raw == b"\x01"


def _void(raw: bytes) -> None:
    return None


# By type OID: int8, int4, int2, text, varchar, name, float8, jsonb, bytea, bool, void.
_DECODERS: dict[int, Callable[[bytes], Any]] = {
    20: _int,
    23: _int,
    21: _int,
    25: _text,
    1043: _text,
    19: _text,
    701: _float,
    3802: _jsonb,
    17: _bytes,
    16: _bool,
    2278: _void,
}


class NulInTextError(ValueError):
    """A text parameter holds U+0000 (PostgreSQL's text cannot)."""


def _array(values: list[Any]) -> bytes | None:
    parts = []
    for value in values:
        if not isinstance(value, str):
            return None
        if "\x00" in value:
            raise NulInTextError
        parts.append('"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"')
    return ("{" + ",".join(parts) + "}").encode()


def _encode(params: Sequence[Any]) -> tuple[list[bytes | None], list[int]] | None:
    values: list[bytes | None] = []
    formats: list[int] = []
    for value in params:
        if value is None:
            values.append(None)
            formats.append(0)
        elif isinstance(value, str):
            if "\x00" in value:
                raise NulInTextError
            values.append(value.encode())
            formats.append(0)
        elif isinstance(value, bool):
            values.append(b"t" if value else b"f")
            formats.append(0)
        elif isinstance(value, int):
            values.append(str(value).encode())
            formats.append(0)
        elif isinstance(value, float):
            values.append(repr(value).encode())
            formats.append(0)
        elif isinstance(value, bytes):
            values.append(value)
            formats.append(1)
        elif isinstance(value, list):
            literal = _array(value)
            if literal is None:
                return None
            values.append(literal)
            formats.append(0)
        elif isinstance(value, (dict, Jsonb)):
            text = orjson.dumps(value.obj if isinstance(value, Jsonb) else value)
            if b"\\u0000" in text:
                raise NulInTextError
            values.append(text)
            formats.append(0)
        else:
            return None
    return values, formats


class Wire:
    """Prepared statements by their text, per connection (a new connection prepares anew)."""

    def __init__(self) -> None:
        self._names: dict[str, bytes] = {}
        # Per statement: how to decode its columns, or None when a column's type is not one
        # this path decodes (the statement then always goes through psycopg).
        self._decoders: dict[str, list[Callable[[bytes], Any]] | None] = {}
        self._prepared: weakref.WeakKeyDictionary[psycopg.Connection[Any], set[bytes]] = (
            weakref.WeakKeyDictionary()
        )

    def run(self, conn: psycopg.Connection[Any], statement: str, params: Sequence[Any], fetch: str) -> Any:
        """The statement's rows ("all"), first row ("one") or row count ("count"). Raises
        NotImplementedError, before running anything, when a parameter or a result column
        is not one this path takes (the caller then uses psycopg)."""
        if self._decoders.get(statement, ()) is None:
            raise NotImplementedError
        encoded = _encode(params)
        if encoded is None:
            raise NotImplementedError
        values, formats = encoded
        name = self._names.get(statement)
        if name is None:
            name = self._names[statement] = f"acp_{len(self._names)}".encode()
        pgconn = conn.pgconn
        prepared = self._prepared.setdefault(conn, set())
        if name not in prepared:
            numbered, count = statement, 0
            while "%s" in numbered:
                count += 1
                numbered = numbered.replace("%s", f"${count}", 1)
            _check(conn, pgconn.prepare(name, numbered.encode()))
            prepared.add(name)
            if statement not in self._decoders:
                described = _check(conn, pgconn.describe_prepared(name))
                types = [described.ftype(column) for column in range(described.nfields)]
                known = all(oid in _DECODERS for oid in types)
                self._decoders[statement] = [_DECODERS[oid] for oid in types] if known else None
        decoders = self._decoders[statement]
        if decoders is None:
            raise NotImplementedError
        # libpq takes None for a NULL parameter (psycopg's stub says otherwise).
        result = _check(conn, pgconn.exec_prepared(name, cast(Any, values), formats, result_format=1))
        if fetch == "count":
            return result.command_tuples or 0
        rows = [
            tuple(
                None if (raw := result.get_value(row, column)) is None else decode(raw)
                for column, decode in enumerate(decoders)
            )
            for row in range(result.ntuples)
        ]
        if fetch == "one":
            return rows[0] if rows else None
        return rows


def _check(conn: psycopg.Connection[Any], result: pq.abc.PGresult) -> pq.abc.PGresult:
    if result.status not in _OK:
        raise errors.error_from_result(result, encoding=conn.info.encoding)
    return result
