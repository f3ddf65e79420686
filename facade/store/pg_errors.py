"""What a PostgreSQL failure is to the store's callers: the store's own errors (a clash, a
busy or full or unreachable database, a NUL the caller sent), else the failure itself."""

from __future__ import annotations

import time
from typing import NoReturn

import psycopg
from psycopg import errors

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.store.base import (
    StoreBusyError,
    StoreConflictError,
    StoreDownError,
    StoreFullError,
)
from cleveragents.acp.facade.store.pg_wire import NulInTextError

# Failures that mean "another transaction was in the way": nothing was written, retry.
BUSY = (errors.LockNotAvailable, errors.DeadlockDetected, errors.SerializationFailure)


class NulCharacterError(ACPError):
    """A value for a text column holds U+0000, which PostgreSQL cannot store (nor look up)."""

    def __init__(self) -> None:
        super().__init__(
            ErrorCode.INVALID_PARAMS,
            "a name, id, label or attribute holds a NUL character (U+0000), which this server's "
            "PostgreSQL store cannot keep",
            {"reason": "NUL_CHARACTER"},
        )


def unreachable(exc: BaseException) -> bool:
    """The connection is gone or the server refuses work: a restart, a failover, a network
    cut (no SQLSTATE, class 08, or an operator's shutdown, 57P01-57P03). A statement sent
    through libpq directly (pg_wire.py) reports a lost connection as a bare DatabaseError
    with no SQLSTATE."""
    if isinstance(exc, BUSY) or not isinstance(exc, psycopg.DatabaseError):
        return False
    if not isinstance(exc, psycopg.OperationalError) and type(exc) is not psycopg.DatabaseError:
        return False
    state = exc.sqlstate
    return state is None or state.startswith("08") or state in ("57P01", "57P02", "57P03")


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def store_error(exc: Exception, started: float) -> Exception | None:
    """What a statement's failure is to the store's callers; None: itself."""
    if isinstance(exc, errors.UniqueViolation):
        return StoreConflictError(str(exc).splitlines()[0])
    if isinstance(exc, BUSY):
        return StoreBusyError(time.monotonic() - started)
    if isinstance(exc, errors.DiskFull):
        return StoreFullError(first_line(exc))
    if unreachable(exc):
        return StoreDownError(first_line(exc))
    if isinstance(exc, NulInTextError):
        return NulCharacterError()
    # PostgreSQL's text (and jsonb) cannot hold U+0000, which SQLite's can: a value with one
    # is refused as the caller's, never an internal error.
    if isinstance(exc, psycopg.DataError) and ("NUL" in str(exc) or "\\u0000" in str(exc)):
        return NulCharacterError()
    return None


def reraise(exc: Exception, started: float) -> NoReturn:
    """Raise ``exc`` (being handled) as what it is to the store's callers (``store_error``,
    its cause hidden), else as itself."""
    mapped = store_error(exc, started)
    if mapped is None:
        raise exc
    raise mapped from None
