"""The PostgreSQL store's statements straight through libpq, prepared once per connection.

psycopg's ``Connection.execute`` costs about 100 µs of Python per statement (a cursor, the
adaptation machinery, a generator-driven wait); the store runs a handful of fixed statements
with plain parameters, and libpq's own ``PQexecPrepared`` (which psycopg calls without the GIL
while it waits) does the same work in about a fifth of that: a ``session.show`` read went from
150 µs to 30 µs of CPU, 600 µs to 250 µs of wall time, measured in a loop.

``run`` takes what the store passes (str, int, float, bool, bytes, None, a list of str, a
dict for jsonb) and returns rows decoded by column type; for anything else it returns
``PSYCOPG``, having run nothing, and the caller uses psycopg. Parameters go as text, bytes
as binary; results come back binary.

A read's transaction costs no round trip of its own (libpq's pipeline mode, libpq 14 or
later): its ``BEGIN`` goes in one write with its first statement (``run(..., begin=)``), and
its ``COMMIT`` is sent without waiting for the answer (``commit_later``), which is read with
the next read's first statement or before any other use of the connection (``settle``). A
one-statement read is one round trip instead of three; the server ends the transaction as
soon as the ``COMMIT`` arrives, so no snapshot is held while the connection idles.
"""

from __future__ import annotations

import enum
import itertools
import logging
import select
import struct
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

import orjson
import psycopg
from psycopg import errors, pq
from psycopg.types.json import Jsonb

log = logging.getLogger(__name__)

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
DECODERS: dict[int, Callable[[bytes], Any]] = {
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


class Fallback(enum.Enum):
    """``Wire.run``'s answer for a statement it does not take (a value, not an exception, so
    no error raised on the way is mistaken for it)."""

    PSYCOPG = "run it through psycopg"


PSYCOPG = Fallback.PSYCOPG


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


def encode(params: Sequence[Any]) -> tuple[list[bytes | None], list[int]] | None:
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


# A statement ready to send: its name, parameter values and formats, column decoders.
_Prepared = tuple[bytes, list[bytes | None], list[int], list[Callable[[bytes], Any]]]


def rows(result: pq.abc.PGresult, decoders: list[Callable[[bytes], Any]]) -> list[tuple[Any, ...]]:
    return [
        tuple(
            None if (raw := result.get_value(row, column)) is None else decode(raw)
            for column, decode in enumerate(decoders)
        )
        for row in range(result.ntuples)
    ]


class Wire:
    """Prepared statements by their text, per connection (a new connection prepares anew)."""

    def __init__(self) -> None:
        self._names: dict[str, bytes] = {}
        # Names are drawn from a counter (atomic under the GIL): two store threads naming two
        # new statements at once must not both take ``acp_<len(_names)>``, or a connection
        # that prepared one would run it for the other.
        self._numbers = itertools.count()
        # Per statement: how to decode its columns, or None when a column's type is not one
        # this path decodes (the statement then always goes through psycopg).
        self._decoders: dict[str, list[Callable[[bytes], Any]] | None] = {}
        self._prepared: weakref.WeakKeyDictionary[psycopg.Connection[Any], set[bytes]] = (
            weakref.WeakKeyDictionary()
        )

    def run(
        self,
        conn: psycopg.Connection[Any],
        statement: str,
        params: Sequence[Any],
        fetch: str,
        begin: bytes | None = None,
    ) -> Any:
        """The statement's rows ("all"), first row ("one") or row count ("count"); run after
        ``begin`` (a transaction's BEGIN) in the same round trip when given. ``PSYCOPG``,
        with nothing run, when a parameter or a result column is not one this path takes."""
        fresh = begin is not None or conn.info.transaction_status == pq.TransactionStatus.IDLE
        try:
            return self._run(conn, statement, params, fetch, begin)
        except errors.InvalidSqlStatementName:
            if not self._lost(conn, fresh):
                raise
        return self._run(conn, statement, params, fetch, begin)

    def _run(
        self,
        conn: psycopg.Connection[Any],
        statement: str,
        params: Sequence[Any],
        fetch: str,
        begin: bytes | None,
    ) -> Any:
        prepared = self._prepare(conn, statement, params)
        if prepared is None:
            return PSYCOPG
        name, values, formats, decoders = prepared
        if begin is None:
            # libpq takes None for a NULL parameter (psycopg's stub says otherwise).
            result = _check(
                conn, conn.pgconn.exec_prepared(name, cast(Any, values), formats, result_format=1)
            )
        else:
            (result,) = _pipelined(conn, begin, [(name, values, formats)])
        if fetch == "count":
            return result.command_tuples or 0
        found = rows(result, decoders)
        if fetch == "one":
            return found[0] if found else None
        return found

    def run_all(
        self, conn: psycopg.Connection[Any], statements: Sequence[tuple[str, Sequence[Any]]], begin: bytes
    ) -> list[list[tuple[Any, ...]]] | Fallback:
        """Each statement's rows, all sent after ``begin`` in one round trip (a read that
        needs several statements pays one wait, not one each); ``PSYCOPG``, with nothing
        run, when one of them is not one this path takes."""
        try:
            return self._run_all(conn, statements, begin)
        except errors.InvalidSqlStatementName:
            self._lost(conn, True)
        return self._run_all(conn, statements, begin)

    def _run_all(
        self, conn: psycopg.Connection[Any], statements: Sequence[tuple[str, Sequence[Any]]], begin: bytes
    ) -> list[list[tuple[Any, ...]]] | Fallback:
        prepared = [self._prepare(conn, statement, params) for statement, params in statements]
        sends = []
        for one in prepared:
            if one is None:
                return PSYCOPG
            sends.append(one[:3])
        results = _pipelined(conn, begin, sends)
        return [rows(result, cast(_Prepared, one)[3]) for result, one in zip(results, prepared, strict=True)]

    def _lost(self, conn: psycopg.Connection[Any], fresh: bool) -> bool:
        """The connection's statements were dropped behind this path's back (a ``DEALLOCATE
        ALL`` or ``DISCARD ALL`` sent on it, a pooler): they are prepared again at its next
        use. Whether the caller may run the statement again at once: when it was its
        transaction's first (or ran alone) nothing is lost once the aborted transaction is
        rolled back; otherwise the failure is the caller's, as any failed statement in a
        transaction is."""
        self._prepared.pop(conn, None)
        log.warning("prepared statements gone from a store connection; preparing them again")
        if not fresh:
            return False
        if conn.info.transaction_status != pq.TransactionStatus.IDLE:
            _check(conn, conn.pgconn.exec_(b"ROLLBACK"))
        return True

    def _prepare(
        self, conn: psycopg.Connection[Any], statement: str, params: Sequence[Any]
    ) -> _Prepared | None:
        """The statement prepared on ``conn`` and its parameters encoded; None when this path
        does not take it."""
        if self._decoders.get(statement, ()) is None:
            return None
        encoded = encode(params)
        if encoded is None:
            return None
        values, formats = encoded
        name = self._names.get(statement)
        if name is None:
            name = self._names[statement] = f"acp_{next(self._numbers)}".encode()
        pgconn = conn.pgconn
        prepared = self._prepared.setdefault(conn, set())
        if name not in prepared:
            self.settle(conn)
            numbered, count = statement, 0
            while "%s" in numbered:
                count += 1
                numbered = numbered.replace("%s", f"${count}", 1)
            _check(conn, pgconn.prepare(name, numbered.encode()))
            prepared.add(name)
            if statement not in self._decoders:
                described = _check(conn, pgconn.describe_prepared(name))
                types = [described.ftype(column) for column in range(described.nfields)]
                known = all(oid in DECODERS for oid in types)
                self._decoders[statement] = [DECODERS[oid] for oid in types] if known else None
        decoders = self._decoders[statement]
        if decoders is None:
            return None
        return name, values, formats, decoders

    @staticmethod
    def commit_later(conn: psycopg.Connection[Any]) -> None:
        """Send COMMIT and return without its answer (the connection then owes it: read by
        ``run(..., begin=)`` or ``settle`` before any other use)."""
        pgconn = conn.pgconn
        pgconn.enter_pipeline_mode()
        pgconn.send_query_params(b"COMMIT", None)
        pgconn.pipeline_sync()

    @staticmethod
    def owes(conn: psycopg.Connection[Any]) -> bool:
        """Whether the answer to a ``commit_later`` is still to be read."""
        return conn.pgconn.pipeline_status != pq.PipelineStatus.OFF

    @staticmethod
    def settle(conn: psycopg.Connection[Any]) -> None:
        """Read the answer a ``commit_later`` left, if any: the connection is then usable
        by psycopg and by synchronous libpq calls again."""
        pgconn = conn.pgconn
        if pgconn.pipeline_status == pq.PipelineStatus.OFF:
            return
        (committed,) = _drain(conn, 1)
        pgconn.exit_pipeline_mode()
        _committed(conn, committed)


def _pipelined(
    conn: psycopg.Connection[Any], begin: bytes, sends: Sequence[tuple[bytes, list[bytes | None], list[int]]]
) -> list[pq.abc.PGresult]:
    """``begin`` then the prepared statements, in one round trip that also reads the answer
    to a COMMIT the connection owes; the statements' results."""
    pgconn = conn.pgconn
    owed = pgconn.pipeline_status != pq.PipelineStatus.OFF
    if not owed:
        pgconn.enter_pipeline_mode()
    pgconn.send_query_params(begin, None)
    for name, values, formats in sends:
        pgconn.send_query_prepared(name, cast(Any, values), formats, result_format=1)
    pgconn.pipeline_sync()
    results = _drain(conn, 2 if owed else 1)
    pgconn.exit_pipeline_mode()
    if owed:
        _committed(conn, results.pop(0))
    began, *answers = results
    _check(conn, began)
    return [_check(conn, result) for result in answers]


def _drain(conn: psycopg.Connection[Any], syncs: int) -> list[pq.abc.PGresult]:
    """The results of the pipeline's statements up to its ``syncs``-th sync point, in order.
    psycopg's ``get_result`` holds the GIL while libpq waits for the server (the whole
    process stalls, and a statement waiting for a lock another thread of it holds waits out
    ``lock_timeout``): the socket is waited for here, without it, until a result is in."""
    pgconn = conn.pgconn
    results: list[pq.abc.PGresult] = []
    idle = False
    poller: select.poll | None = None
    while syncs:
        while pgconn.is_busy():
            if poller is None:
                poller = select.poll()
                poller.register(pgconn.socket, select.POLLIN)
            poller.poll()
            pgconn.consume_input()
        result = pgconn.get_result()
        if result is None:
            # One None ends a statement's results; a second means nothing more will come.
            if idle:
                raise psycopg.OperationalError(pgconn.get_error_message() or "the pipeline ended early")
            idle = True
            continue
        idle = False
        if result.status == pq.ExecStatus.PIPELINE_SYNC:
            syncs -= 1
        else:
            results.append(result)
    return results


def _committed(conn: psycopg.Connection[Any], result: pq.abc.PGresult) -> None:
    """A read's COMMIT came back: its answer is given already and it wrote nothing, so a
    failure is only worth a warning (a lost connection shows at the statement after)."""
    if result.status not in _OK:
        error = errors.error_from_result(result, encoding=conn.info.encoding)
        log.warning("a read's COMMIT failed: %s", error)


def _check(conn: psycopg.Connection[Any], result: pq.abc.PGresult) -> pq.abc.PGresult:
    if result.status not in _OK:
        raise errors.error_from_result(result, encoding=conn.info.encoding)
    return result
