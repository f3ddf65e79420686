"""How webhooks are stored: three records per subscription, all keyed by its id.

- ``webhook``: the subscription as callers see it (a ``Webhook`` without its health), by
  (namespace, name), with a revision callers update at;
- ``webhook_state``: what delivery moves (cursor, counters, last results, ``epoch``), so a
  delivery never moves the subscription's revision. ``epoch`` grows whenever a caller
  changes what the deliverer must do (an update, a replay, enabling): the deliverer's
  writes name the epoch they were made under and are refused at another (it restarts from
  the stored cursor);
- ``webhook_secret``: the signing secrets, never in an answer but the one that made them.

The history of attempts is an item collection in a ring of ``HISTORY`` rows per
subscription (row ``number % HISTORY``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.store.base import Record, Store
from cleveragents.acp.v1 import webhook_pb2

KIND = "webhook"
STATE_KIND = "webhook_state"
SECRET_KIND = "webhook_secret"
HISTORY_COLLECTION = "webhook_deliveries"
HISTORY = 500


@dataclass
class State:
    cursor: int = 0
    epoch: int = 0
    consecutive_failures: int = 0
    delivered: int = 0
    failed_attempts: int = 0
    # Attempts recorded so far: the next history row's number.
    attempts: int = 0
    last_success_time: float = 0.0
    last_failure_time: float = 0.0
    last_error: str = ""
    disabled_reason: str = ""
    next_attempt_time: float = 0.0

    @classmethod
    def of(cls, record: Record | None) -> State:
        if record is None:
            return cls()
        raw: dict[str, Any] = json.loads(record.body)
        known = cls.__dataclass_fields__
        return cls(**{key: value for key, value in raw.items() if key in known})

    def record(self, webhook_id: str, namespace: str, now: float) -> Record:
        body = json.dumps(asdict(self), separators=(",", ":")).encode()
        return Record(
            kind=STATE_KIND, id=webhook_id, namespace=namespace, body=body, create_time=now, update_time=now
        )


@dataclass
class Secrets:
    current: str
    previous: str = ""
    # Seconds since the epoch until which ``previous`` still signs.
    previous_until: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, record: Record) -> Secrets:
        raw = json.loads(record.body)
        return cls(str(raw["current"]), str(raw.get("previous", "")), float(raw.get("previous_until", 0.0)))

    def signing(self, now: float) -> list[str]:
        """The secrets that sign now, newest first."""
        return (
            [self.current, self.previous] if self.previous and now < self.previous_until else [self.current]
        )

    def record(self, webhook_id: str, namespace: str, now: float) -> Record:
        body = json.dumps(
            {"current": self.current, "previous": self.previous, "previous_until": self.previous_until},
            separators=(",", ":"),
        ).encode()
        return Record(
            kind=SECRET_KIND, id=webhook_id, namespace=namespace, body=body, create_time=now, update_time=now
        )


def stored(record: Record) -> webhook_pb2.Webhook:
    return webhook_pb2.Webhook.FromString(record.body)


def to_record(entry: webhook_pb2.Webhook) -> Record:
    return Record(
        kind=KIND,
        id=entry.meta.id,
        namespace=entry.meta.namespace,
        name=entry.name,
        revision=entry.revision,
        state="enabled" if entry.enabled else "disabled",
        labels=dict(entry.labels),
        body=entry.SerializeToString(deterministic=True),
        create_time=entry.meta.create_time.ToNanoseconds() / 1e9,
        update_time=entry.meta.update_time.ToNanoseconds() / 1e9,
    )


def timestamp(seconds: float) -> Timestamp:
    stamp = Timestamp()
    if seconds:
        stamp.FromNanoseconds(int(seconds * 1e9))
    return stamp


def with_health(
    entry: webhook_pb2.Webhook, state: State, head: int, previous_until: float
) -> webhook_pb2.Webhook:
    """The entry as answered: its health from the state, the backlog from the log's head."""
    shown = webhook_pb2.Webhook()
    shown.CopyFrom(entry)
    health = shown.health
    health.cursor = state.cursor
    health.consecutive_failures = state.consecutive_failures
    health.delivered = state.delivered
    health.failed_attempts = state.failed_attempts
    health.last_error = state.last_error
    health.disabled_reason = state.disabled_reason
    health.backlog = max(0, head - state.cursor)
    if state.last_success_time:
        health.last_success_time.CopyFrom(timestamp(state.last_success_time))
    if state.last_failure_time:
        health.last_failure_time.CopyFrom(timestamp(state.last_failure_time))
    if state.next_attempt_time and state.consecutive_failures:
        health.next_attempt_time.CopyFrom(timestamp(state.next_attempt_time))
    if previous_until:
        shown.previous_secret_expire_time.CopyFrom(timestamp(previous_until))
    return shown


def not_found(namespace: str, name: str) -> ACPError:
    return ACPError(
        ErrorCode.NOT_FOUND,
        f"no webhook {name!r} in namespace {namespace!r}",
        {"kind": "webhook", "namespace": namespace, "name": name},
        refinement="WEBHOOK_NOT_FOUND",
    )


def load(store: Store, namespace: str, name: str) -> tuple[Record, State]:
    record = store.get_by_name(KIND, namespace, name)
    if record is None:
        raise not_found(namespace, name)
    return record, State.of(store.get(STATE_KIND, record.id))


def history_row(number: int) -> int:
    return number % HISTORY


def put_state(store: Store, webhook_id: str, namespace: str, state: State, now: float) -> None:
    put(store, state.record(webhook_id, namespace, now))


def put(store: Store, record: Record) -> None:
    """Replace a state or secret record (they carry no revision of their own)."""
    try:
        store.update(record)
    except KeyError:
        store.insert(record)
