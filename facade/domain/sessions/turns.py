"""Turns: how a session's turns sit in the store and who may run one (ACP 1.3).

A turn is a record of kind ``session.turn`` (the ``Turn`` proto as body; attrs
``session_id``, and ``active`` = the session id while it is queued or running, so the
session's queue is one indexed lookup). A queued turn's user message waits in the
``session.turn.pending`` collection: it joins the history only when the turn starts, so
the history reads ``Q1 A1 Q2 A2`` whatever order the tells arrived in.

Who runs the session's turn is a lease of the store (``turn:<session id>``, the plan
engine's leases: on the store's clock, with a fencing token checked by every write of the
turn), so one turn runs per session across ``--workers`` processes and PostgreSQL
replicas. A queued turn is held by a lease of its own (``turnq:<turn id>``) renewed by
the process that accepted it: when that process dies, the turn's lease lapses and the
next waiter fails it instead of waiting for it forever. A stop (``session.cancel_turn``,
an ``interrupt`` or ``rollback`` tell) is a request left on the running turn's lease,
which its runner polls; a runner that is gone is settled by whoever asks.
"""

from __future__ import annotations

from collections.abc import Iterable

from google.protobuf import timestamp_pb2

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.sessions.records import seconds
from cleveragents.acp.facade.store.base import ListQuery, Record, Store
from cleveragents.acp.v1 import common_pb2, session_pb2

TURN_KIND = "session.turn"
PENDING = "session.turn.pending"
RUN_PREFIX = "turn:"
QUEUE_PREFIX = "turnq:"
# The most turns of one session a queue lookup or a show reads.
MAX_ACTIVE = 1000
MAX_TURNS = 100_000

QUEUED = session_pb2.TURN_STATE_QUEUED
RUNNING = session_pb2.TURN_STATE_RUNNING
SUCCEEDED = session_pb2.TURN_STATE_SUCCEEDED
FAILED = session_pb2.TURN_STATE_FAILED
CANCELLED = session_pb2.TURN_STATE_CANCELLED
INTERRUPTED = session_pb2.TURN_STATE_INTERRUPTED
ACTIVE_STATES = frozenset({QUEUED, RUNNING})

TURN_STATE_NAMES: dict[int, str] = {
    QUEUED: "queued",
    RUNNING: "running",
    SUCCEEDED: "succeeded",
    FAILED: "failed",
    CANCELLED: "cancelled",
    INTERRUPTED: "interrupted",
}
POLICY_NAMES: dict[int, str] = {
    session_pb2.MULTITASK_POLICY_REJECT: "reject",
    session_pb2.MULTITASK_POLICY_ENQUEUE: "enqueue",
    session_pb2.MULTITASK_POLICY_INTERRUPT: "interrupt",
    session_pb2.MULTITASK_POLICY_ROLLBACK: "rollback",
}


def run_lease(session_id: str) -> str:
    return RUN_PREFIX + session_id


def queue_lease(turn_id: str) -> str:
    return QUEUE_PREFIX + turn_id


def key(session_id: str, turn_id: str) -> str:
    """A turn's record id: its session's id and its own, so a session imported under another
    id (a copy beside the original) keeps its turns' ids without clashing."""
    return f"{session_id}.{turn_id}"


def to_record(turn: session_pb2.Turn, namespace: str, revision: int = 1) -> Record:
    active = turn.state in ACTIVE_STATES
    return Record(
        kind=TURN_KIND,
        id=key(turn.session_id, turn.id),
        namespace=namespace,
        body=turn.SerializeToString(deterministic=True),
        revision=revision,
        state=TURN_STATE_NAMES.get(turn.state, ""),
        attrs={"session_id": turn.session_id, "active": turn.session_id if active else ""},
        create_time=seconds(turn.create_time),
        update_time=seconds(turn.end_time if turn.HasField("end_time") else turn.create_time),
    )


def read(store: Store, session_id: str, turn_id: str) -> tuple[Record, session_pb2.Turn] | None:
    record = store.get(TURN_KIND, key(session_id, turn_id))
    if record is None:
        return None
    return record, session_pb2.Turn.FromString(record.body)


def save(store: Store, record: Record, turn: session_pb2.Turn) -> Record:
    """Write the turn over the record it was read from (StaleRevisionError if it moved)."""
    new = to_record(turn, record.namespace, record.revision + 1)
    store.update(new, expected_revision=record.revision)
    return new


def active(store: Store, session_id: str) -> list[tuple[Record, session_pb2.Turn]]:
    """The session's queued and running turns, oldest first (ids are ULIDs)."""
    records = store.query(ListQuery(TURN_KIND, attrs={"active": session_id}, limit=MAX_ACTIVE))
    return [(r, session_pb2.Turn.FromString(r.body)) for r in sorted(records, key=lambda r: r.id)]


def of_session(store: Store, session_id: str) -> list[session_pb2.Turn]:
    """Every turn of the session, oldest first."""
    records = store.query(ListQuery(TURN_KIND, attrs={"session_id": session_id}, limit=MAX_TURNS))
    return [session_pb2.Turn.FromString(r.body) for r in sorted(records, key=lambda r: r.id)]


def by_ids(store: Store, session_id: str, ids: Iterable[str]) -> list[session_pb2.Turn]:
    found = []
    for turn_id in sorted(set(ids)):
        got = read(store, session_id, turn_id)
        if got is not None:
            found.append(got[1])
    return found


def pending(store: Store, turn_id: str) -> session_pb2.Message | None:
    items = store.list_items(PENDING, turn_id)
    return session_pb2.Message.FromString(items[0][1]) if items else None


def end(
    turn: session_pb2.Turn, state: int, stamp: timestamp_pb2.Timestamp, why: str = "", code: str = ""
) -> None:
    turn.state = state  # type: ignore[assignment]
    turn.end_time.CopyFrom(stamp)
    if why:
        turn.error.CopyFrom(common_pb2.ErrorInfo(code=code or TURN_STATE_NAMES[state], message=why))


def not_found(session_id: str, turn_id: str) -> ACPError:
    return ACPError(
        ErrorCode.NOT_FOUND,
        f"no turn {turn_id!r} in session {session_id!r}",
        {"session_id": session_id, "turn_id": turn_id},
        refinement="TURN_NOT_FOUND",
    )


def in_progress(session_id: str, turn: session_pb2.Turn) -> ACPError:
    state = TURN_STATE_NAMES[turn.state]
    return ACPError(
        ErrorCode.INVALID_STATE,
        f"session {session_id} has turn {turn.id} {state}; the multitask policy `reject` refuses "
        "another tell until it ends (enqueue, interrupt or rollback would not)",
        {"session_id": session_id, "turn_id": turn.id, "state": state, "multitask": "reject"},
        refinement="TURN_IN_PROGRESS",
    )


def finished(session_id: str, turn: session_pb2.Turn) -> ACPError:
    state = TURN_STATE_NAMES[turn.state]
    return ACPError(
        ErrorCode.INVALID_STATE,
        f"turn {turn.id} of session {session_id} already ended {state}; only a queued or running turn "
        "can be cancelled",
        {"session_id": session_id, "turn_id": turn.id, "state": state},
        refinement="TURN_FINISHED",
    )
