"""Cost that must not grow with what is stored: the same call against a small and a big
database, in the same run, as a ratio (goal <= 1.5 each).

- ``list_scaling_ratio``: the worst, over every case, of a first page's latency (best of the calls) with
  100,000 records of a kind / with 1,000: sessions (unfiltered, and by state, actor and
  project matching few or none), plans (unfiltered, by state, project and session) and
  registry entries (unfiltered, by labels matching few or none).
- ``resume_scaling_ratio``: the worst of the time to the first event when subscribing in a
  1,000,000-event log / in a 1,000-event log: near the head, and filtered to one session
  and to one plan from sequence 0 when nearly every event belongs to others.

The databases are filled with direct bulk inserts (the store's own schema, rows cloned
from real protos), then served by the product's facade in-process over the local client:
what is timed is the call, not the setup. The matching rows are the oldest ones, the worst
place for a list read newest first.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from ulid import ULID

from bench.run import Run
from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.store import sqlite_lists
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import common_pb2, events_pb2, plan_pb2, registry_pb2, session_pb2

# (small, big) populations per kind and event logs, per mode.
RECORDS = {"full": (1_000, 100_000), "quick": (1_000, 100_000), "smoke": (100, 2_000)}
EVENTS = {"full": (1_000, 1_000_000), "quick": (1_000, 1_000_000), "smoke": (1_000, 20_000)}
CALLS = {"full": 41, "quick": 21, "smoke": 5}
# Rows matching a "few" filter; the target session's and plan's events in the log.
FEW = 5
TARGET_EVENTS = 10
NAMESPACE = "default"

_RECORD_SQL = (
    "INSERT INTO records (kind, id, namespace, name, revision, state, attrs, labels, create_time, "
    "update_time, body) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
)
_TAG_SQL = "INSERT INTO record_tags (kind, key, value, namespace, id) VALUES (?,?,?,?,?)"


def _meta(id_: str, now: float) -> common_pb2.EntityMeta:
    meta = common_pb2.EntityMeta(id=id_, namespace=NAMESPACE)
    meta.create_time.FromNanoseconds(int(now * 1e9))
    meta.update_time.FromNanoseconds(int(now * 1e9))
    return meta


def _rows(count: int) -> Iterator[tuple[int, str, float]]:
    """(index, id, time) oldest first: ULIDs in creation order."""
    now = time.time() - count
    for index in range(count):
        yield index, str(ULID.from_timestamp(now + index)), now + index


def _json(value: dict[str, str]) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _tags(
    kind: str, id_: str, state: str, attrs: dict[str, str], labels: dict[str, str]
) -> list[tuple[Any, ...]]:
    return [
        (kind, key, value, NAMESPACE, id_) for key, value in sorted(sqlite_lists.tags(state, attrs, labels))
    ]


def _fill_records(db: sqlite3.Connection, count: int) -> None:
    """``count`` sessions, plans and actors; the oldest ``FEW`` of each are the rare ones."""
    sessions: list[tuple[Any, ...]] = []
    plans: list[tuple[Any, ...]] = []
    actors: list[tuple[Any, ...]] = []
    tags: list[tuple[Any, ...]] = []
    for index, id_, now in _rows(count):
        rare = index < FEW
        state = "closed" if rare else "active"
        attrs = {"orchestrator": "scripted", "project": "rare" if rare else "common"}
        body = session_pb2.Session(
            meta=_meta(id_, now),
            title=f"session {index}",
            state=session_pb2.SESSION_STATE_CLOSED if rare else session_pb2.SESSION_STATE_ACTIVE,
            orchestrator="scripted",
            project=attrs["project"],
        ).SerializeToString()
        sessions.append(("session", id_, NAMESPACE, None, 1, state, _json(attrs), "{}", now, now, body))
        tags += _tags("session", id_, state, attrs, {})
    for index, id_, now in _rows(count):
        rare = index < FEW
        state = "failed" if rare else "succeeded"
        attrs = {"action": "act", "project": "rare" if rare else "common", "phase": "execute"}
        body = plan_pb2.Plan(
            meta=_meta(id_, now),
            action="act",
            project=attrs["project"],
            phase=plan_pb2.PLAN_PHASE_EXECUTE,
            state=plan_pb2.PLAN_STATE_FAILED if rare else plan_pb2.PLAN_STATE_SUCCEEDED,
        ).SerializeToString()
        plans.append(("plan", id_, NAMESPACE, None, 1, state, _json(attrs), "{}", now, now, body))
        tags += _tags("plan", id_, state, attrs, {})
    for index, id_, now in _rows(count):
        labels = {"team": "rare" if index < FEW else "common"}
        name = f"actor-{index:07d}"
        body = registry_pb2.Actor(
            meta=_meta(id_, now), name=name, labels=labels, revision=1
        ).SerializeToString()
        actors.append(("actor", id_, NAMESPACE, name, 1, "", "{}", _json(labels), now, now, body))
        tags += _tags("actor", id_, "", {}, labels)
    with db:
        db.executemany(_RECORD_SQL, sessions + plans + actors)
        db.executemany(_TAG_SQL, tags)


def _fill_events(db: sqlite3.Connection, count: int) -> None:
    """``count`` events spread over a thousand other sessions and plans; the target
    session's and plan's ``TARGET_EVENTS`` are the newest."""
    body = events_pb2.Event(
        namespace=NAMESPACE, type="log.record", log_record=events_pb2.LogRecord(message="x")
    ).SerializeToString()
    now = time.time()
    others = count - 2 * TARGET_EVENTS

    def rows() -> Iterator[tuple[Any, ...]]:
        for seq in range(1, others + 1):
            yield (seq, NAMESPACE, "log.record", f"plan-{seq % 1000}", f"session-{seq % 1000}", now, body)
        for offset in range(2 * TARGET_EVENTS):
            seq = others + 1 + offset
            target = offset % 2 == 0
            plan_id, session_id = ("target-plan", "") if target else ("", "target-session")
            yield (seq, NAMESPACE, "log.record", plan_id, session_id, now, body)

    with db:
        db.executemany(
            "INSERT INTO events (sequence, namespace, type, plan_id, session_id, time, body) "
            "VALUES (?,?,?,?,?,?,?)",
            rows(),
        )


def _database(path: pathlib.Path, records: int, events: int) -> pathlib.Path:
    SQLiteStore(path).close()  # the schema, at the current version
    db = sqlite3.connect(str(path))
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=OFF")
        # The bulk load's index pages stay in memory (the quick run spent minutes re-reading them).
        db.execute("PRAGMA cache_size=-262144")
        _fill_records(db, records)
        _fill_events(db, events)
    finally:
        db.close()
    return path


async def _best_ms(calls: int, call: Callable[[], Awaitable[object]]) -> float:
    """The fastest of ``calls`` timings: the call's own cost (other work on a shared
    machine only ever adds to it), after one warming call."""
    await call()
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        await call()
        times.append((time.perf_counter() - began) * 1000)
    return min(times)


def _list_cases(client: ACPClient) -> dict[str, Callable[[], Awaitable[object]]]:
    def call(operation: str, **fields: Any) -> Callable[[], Awaitable[object]]:
        return lambda: client.call(operation, namespace=NAMESPACE, **fields)

    return {
        "sessions": call("session.list"),
        "sessions_state": call("session.list", state=session_pb2.SESSION_STATE_CLOSED),
        "sessions_actor": call("session.list", actor="nobody"),
        "sessions_project": call("session.list", project="rare"),
        "plans": call("plan.list"),
        "plans_state": call("plan.list", state=plan_pb2.PLAN_STATE_FAILED),
        "plans_project": call("plan.list", project="rare"),
        "plans_session": call("plan.list", session_id="no-such-session"),
        "actors": call("actor.list"),
        "actors_labels_few": call("actor.list", labels={"team": "rare"}),
        "actors_labels_none": call("actor.list", labels={"team": "nobody"}),
    }


async def _first_event(client: ACPClient, **fields: Any) -> None:
    stream = client.subscribe(**fields)
    try:
        await anext(stream)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


def _resume_cases(client: ACPClient, head: int) -> dict[str, Callable[[], Awaitable[object]]]:
    return {
        "near_head": lambda: _first_event(client, after_sequence=head - 5),
        "session_from_0": lambda: _first_event(client, session_id="target-session", after_sequence=0),
        "plan_from_0": lambda: _first_event(client, plan_id="target-plan", after_sequence=0),
    }


async def _measure(db: pathlib.Path, calls: int, events: int) -> tuple[dict[str, float], dict[str, float]]:
    """Milliseconds per list case and per resume case."""
    facade = open_facade(db)
    client = ACPClient(LocalTransport(facade))
    try:
        lists = {name: await _best_ms(calls, call) for name, call in _list_cases(client).items()}
        resumes = {name: await _best_ms(calls, call) for name, call in _resume_cases(client, events).items()}
        return lists, resumes
    finally:
        await client.close()
        await facade.close()


def _ratios(run: Run, figure: str, small: dict[str, float], big: dict[str, float]) -> None:
    ratios = {name: big[name] / small[name] for name in small}
    for name, ratio in ratios.items():
        run.note(f"{figure}_{name}", {"small_ms": small[name], "big_ms": big[name], "ratio": round(ratio, 3)})
    run.record(figure, max(ratios.values()), by="in-process")


def run_all(run: Run) -> None:
    mode = run.mode.name
    folder = run.scratch("scaling")
    (small_records, big_records), (small_events, big_events) = RECORDS[mode], EVENTS[mode]
    began = time.monotonic()
    small = _database(folder / "small.db", small_records, small_events)
    big = _database(folder / "big.db", big_records, big_events)
    run.note("scaling_setup_s", time.monotonic() - began)
    run.note(
        "scaling_populations", {"records": [small_records, big_records], "events": [small_events, big_events]}
    )
    small_lists, small_resumes = asyncio.run(_measure(small, CALLS[mode], small_events))
    big_lists, big_resumes = asyncio.run(_measure(big, CALLS[mode], big_events))
    _ratios(run, "list_scaling_ratio", small_lists, big_lists)
    _ratios(run, "resume_scaling_ratio", small_resumes, big_resumes)
