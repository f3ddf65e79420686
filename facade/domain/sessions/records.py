"""How sessions and their messages sit in the store, shared by sessions, context and export.

A session is a record of kind ``session`` (state ``active``/``closed``; attrs
``orchestrator`` and ``project`` for the list filters) with the ``Session`` proto as
body; its messages are items of the ``session.messages`` collection, in order.
"""

from __future__ import annotations

import io
import os
import threading
import time

from google.protobuf import timestamp_pb2

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.store.base import Record, Store
from cleveragents.acp.v1 import session_pb2

SESSION_KIND = "session"
MESSAGES = "session.messages"

STATE_NAMES: dict[int, str] = {
    session_pb2.SESSION_STATE_ACTIVE: "active",
    session_pb2.SESSION_STATE_CLOSED: "closed",
}


# Ids: ULIDs (48-bit milliseconds, 80 random bits) in Crockford's base32, 10 bits per pair.
_PAIRS = [a + b for a in "0123456789ABCDEFGHJKMNPQRSTVWXYZ" for b in "0123456789ABCDEFGHJKMNPQRSTVWXYZ"]
_SHIFTS = tuple(range(120, -1, -10))
_LOW = (1 << 80) - 1
# The OS's random bytes for 400 ids at a time; the millisecond and value of the last id.
_RANDOM_BYTES = 4000
_random = io.BytesIO()
_last = (-1, 0)
_id_lock = threading.Lock()


def new_id(made: timestamp_pb2.Timestamp) -> str:
    """A new ULID of the millisecond ``made`` is in (so a session's id and its create_time
    agree), as python-ulid's ``str(ULID())`` makes one, in under half its time.

    The same guarantees: the random part is the OS's (os.urandom), fresh in each new
    millisecond, and within one millisecond an id is the previous one plus one (so ids sort
    in the order they were made); only the bytes are fetched 4,000 at a time instead of one
    getrandom call per id (python-ulid's ``_default_randomness`` was 3% of the server's
    samples under session.create). A forked child starts from fresh bytes (``_forget``)."""
    global _random, _last
    ms = made.seconds * 1000 + made.nanos // 1_000_000
    with _id_lock:
        last_ms, last = _last
        if ms == last_ms and last & _LOW != _LOW:
            value = last + 1
        else:
            fresh = _random.read(10)
            if len(fresh) < 10:
                _random = io.BytesIO(os.urandom(_RANDOM_BYTES))
                fresh = _random.read(10)
            value = ms << 80 | int.from_bytes(fresh, "big")
        _last = (ms, value)
    return "".join([_PAIRS[(value >> shift) & 1023] for shift in _SHIFTS])


def _forget() -> None:
    """In a forked child: neither the parent's unused random bytes nor its last id."""
    global _random, _last
    _random, _last = io.BytesIO(), (-1, 0)


os.register_at_fork(after_in_child=_forget)


def now() -> timestamp_pb2.Timestamp:
    current = timestamp_pb2.Timestamp()
    set_now(current)
    return current


def set_now(into: timestamp_pb2.Timestamp) -> None:
    """Set to the current time, in microseconds as ``GetCurrentTime`` has it, in a quarter
    of its time (which goes through a datetime and calendar.timegm)."""
    micros = time.time_ns() // 1000
    into.seconds, into.nanos = micros // 1_000_000, micros % 1_000_000 * 1000


def seconds(stamp: timestamp_pb2.Timestamp) -> float:
    return stamp.seconds + stamp.nanos / 1e9


def to_record(session: session_pb2.Session, revision: int = 1) -> Record:
    """The record of ``session`` at ``revision``, which the session (and its body) carry."""
    session.revision = revision
    return Record(
        kind=SESSION_KIND,
        id=session.meta.id,
        namespace=session.meta.namespace,
        body=session.SerializeToString(deterministic=True),
        revision=revision,
        state=STATE_NAMES[session.state],
        attrs={"orchestrator": session.orchestrator, "project": session.project},
        labels=dict(session.labels),
        create_time=seconds(session.meta.create_time),
        update_time=seconds(session.meta.update_time),
    )


def not_found(session_id: str) -> ACPError:
    return ACPError(
        ErrorCode.NOT_FOUND,
        f"no session {session_id!r}",
        {"session_id": session_id},
        refinement="SESSION_NOT_FOUND",
    )


def load(store: Store, ctx: CallContext, session_id: str) -> tuple[Record, session_pb2.Session]:
    """The session record and message, once the caller may use its namespace."""
    record = store.get(SESSION_KIND, session_id)
    if record is None or not ctx.may_see(record.namespace):
        raise not_found(session_id)
    return record, from_record(record)


def from_record(record: Record) -> session_pb2.Session:
    """The session a record holds, at the record's revision (the store's is the truth)."""
    session = session_pb2.Session.FromString(record.body)
    session.revision = record.revision
    return session


def load_with_messages(
    store: Store, ctx: CallContext, session_id: str
) -> tuple[session_pb2.Session, list[session_pb2.Message]]:
    """``load`` and ``messages`` in one go (one round trip to a PostgreSQL server)."""
    record, items = store.get_with_items(SESSION_KIND, session_id, MESSAGES)
    return with_messages(ctx, session_id, record, items)


async def read_with_messages(
    store: Store, ctx: CallContext, session_id: str
) -> tuple[session_pb2.Session, list[session_pb2.Message]]:
    """``load_with_messages`` in a read of its own, which the store may answer without a thread."""
    record, items = await store.read_with_items(SESSION_KIND, session_id, MESSAGES)
    return with_messages(ctx, session_id, record, items)


def with_messages(
    ctx: CallContext, session_id: str, record: Record | None, items: list[tuple[int, bytes]]
) -> tuple[session_pb2.Session, list[session_pb2.Message]]:
    """The session and its messages from its record and items, once the caller may see them."""
    if record is None or not ctx.may_see(record.namespace):
        raise not_found(session_id)
    return from_record(record), [session_pb2.Message.FromString(body) for _, body in items]


def messages(store: Store, session_id: str) -> list[session_pb2.Message]:
    return [session_pb2.Message.FromString(body) for _, body in store.list_items(MESSAGES, session_id)]
