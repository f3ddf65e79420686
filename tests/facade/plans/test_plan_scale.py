"""Long plans: a step costs the same store work in a plan of any length, and the event
loop serves other calls between steps.

The store is counted, not timed: every row a write passes or removes is one row touched."""

from __future__ import annotations

import itertools
import pathlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.facade import factory
from cleveragents.acp.facade.domain.plans import records
from cleveragents.acp.facade.store.base import Record, StoredEvent
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import plan_pb2, session_pb2
from tests.facade.plans.helpers import add_action, add_profile, add_project, eventually, run, status, use
from tests.facade.plans.model_world import ACTOR, KEY, KEY_ENV
from tests.fake_openai import FakeOpenAI, turn

LONG = 10_000
SAMPLE = 1_000


class CountingStore(SQLiteStore):
    """Counts the rows each write touches and, at every ``tool.completed``, the total so
    far. Durability is not what these tests look at: the file skips fsync."""

    def __init__(self, path: str | pathlib.Path) -> None:
        super().__init__(path, synchronous="OFF")
        self.rows = 0
        self.at_completion: list[int] = []
        self.rewritten: list[str] = []

    def insert(self, record: Record) -> None:
        self.rows += 1
        super().insert(record)

    def update(self, record: Record, expected_revision: int | None = None) -> None:
        self.rows += 1
        super().update(record, expected_revision)

    def append_items(self, collection: str, owner_id: str, bodies: Sequence[bytes]) -> list[int]:
        self.rows += len(bodies)
        return super().append_items(collection, owner_id, bodies)

    def put_items(self, collection: str, owner_id: str, items: Mapping[int, bytes]) -> None:
        self.rows += len(items)
        super().put_items(collection, owner_id, items)

    def delete_items(self, collection: str, owner_id: str) -> None:
        self.rows += len(self.list_items(collection, owner_id))
        self.rewritten.append(collection)
        super().delete_items(collection, owner_id)

    def append_events(self, events: Sequence[StoredEvent]) -> list[int]:
        self.rows += len(events)
        sequences = super().append_events(events)
        self.at_completion.extend(self.rows for e in events if e.type == "tool.completed")
        return sequences


@pytest.fixture
async def counted(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[tuple[ACPClient, list[CountingStore]]]:
    opened: list[CountingStore] = []

    def store(path: str | pathlib.Path, **_options: Any) -> CountingStore:
        opened.append(CountingStore(path))
        return opened[-1]

    monkeypatch.setattr(factory, "SQLiteStore", store)
    facade = factory.open_facade(tmp_path / "acp.db")
    client = ACPClient(LocalTransport(facade))
    try:
        folder = tmp_path / "repo"
        folder.mkdir()
        await add_project(client, folder)
        yield client, opened
    finally:
        await client.close()
        await facade.close()


def writes(count: int) -> list[dict[str, Any]]:
    return [{"tool": "fs.write", "args": {"path": f"out/{i}.txt", "content": f"{i}\n"}} for i in range(count)]


@pytest.mark.timeout(600)
async def test_a_10000_step_plan_completes_at_the_same_cost_per_step(
    counted: tuple[ACPClient, list[CountingStore]],
) -> None:
    client, (store,) = counted
    await add_profile(client, "long", max_steps=LONG)
    await add_action(client, steps=writes(LONG), profile="long")
    plan_id = (await use(client, {})).meta.id
    store.rewritten.clear()
    plan = await run(client, plan_id)
    assert (plan.state, plan.progress.done, plan.progress.total) == (
        plan_pb2.PLAN_STATE_SUCCEEDED,
        LONG,
        LONG,
    )
    marks = store.at_completion
    assert len(marks) == LONG
    first = marks[SAMPLE] - marks[0]
    last = marks[-1] - marks[-1 - SAMPLE]
    # Linear: the last thousand steps touch as many rows as the first thousand (a few each),
    # where rewriting the step list touched the whole list at every step.
    assert first == last
    assert first <= 10 * SAMPLE
    # The step list is written whole once, by the strategy; each step then writes its own row.
    assert store.rewritten.count(records.STEPS) == 1


async def test_another_namespace_is_served_while_a_long_plan_runs(
    counted: tuple[ACPClient, list[CountingStore]], tmp_path: pathlib.Path
) -> None:
    client, _ = counted
    await client.call(
        "resource.add",
        namespace="noisy",
        name="repo",
        spec={"type": "directory", "path": str(tmp_path / "repo")},
    )
    await client.call("project.add", namespace="noisy", name="proj", spec={"resources": ["repo"]})
    await add_action(client, namespace="noisy", steps=writes(SAMPLE))
    created = await client.call("session.create", title="probe")
    assert isinstance(created, session_pb2.CreateSessionResponse)
    used = await use(client, {}, namespace="noisy")
    await client.call("plan.execute", plan_id=used.meta.id)

    # Once the plan has the loop (its first step done), it must hand it back.
    async def started() -> bool:
        return (await status(client, used.meta.id)).progress.done > 0

    await eventually(started, seconds=60)
    # Each probe is answered while the plan is still partway: it runs step by step beside
    # the probes instead of holding the loop until its last step.
    answered_midway = 0
    for _ in range(20):
        shown = await client.call("session.show", session_id=created.session.meta.id)
        assert isinstance(shown, session_pb2.GetSessionResponse)
        plan = await status(client, used.meta.id)
        if plan.state == plan_pb2.PLAN_STATE_RUNNING and plan.progress.done < SAMPLE:
            answered_midway += 1
    assert answered_midway == 20
    await client.call("plan.cancel", plan_id=used.meta.id, reason="test over")


TURNS = 60


@pytest.mark.timeout(300)
async def test_a_model_turn_writes_the_same_rows_however_long_the_plan_ran(
    counted: tuple[ACPClient, list[CountingStore]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each turn of a model actor records its decision and its step as new rows: the last
    turns touch as many rows as the first, where every turn used to rewrite every decision
    and step row."""
    client, (store,) = counted
    monkeypatch.setenv(KEY_ENV, KEY)
    async with FakeOpenAI() as fake:
        await client.call(
            "actor.add",
            name=ACTOR,
            spec={"provider": "openai", "model": "m", "base_url": fake.base_url, "api_key_env": KEY_ENV},
        )
        await client.call("action.add", name="act", spec={"actor": ACTOR, "prompt_template": "Write."})
        fake.then(
            *[turn("", [("fs_write", {"path": f"out/{i}.txt", "content": f"{i}\n"})]) for i in range(TURNS)],
            turn("Done."),
        )
        plan_id = (await use(client, {})).meta.id
        store.rewritten.clear()
        plan = await run(client, plan_id)
    assert plan.state == plan_pb2.PLAN_STATE_SUCCEEDED, plan.last_error
    assert plan.progress.done == plan.progress.total == TURNS
    marks = store.at_completion
    assert len(marks) == TURNS
    per_turn = [later - earlier for earlier, later in itertools.pairwise(marks)]
    assert per_turn[5] == per_turn[-1], per_turn
    # Decisions and steps are written whole once, by the strategy (its root decision).
    assert store.rewritten.count(records.NODES) == 1
    assert store.rewritten.count(records.STEPS) == 1
