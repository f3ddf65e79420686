"""The work a caller's schema and document make is linear (``uniqueItems``, ``enum``) and
bounded (a step budget per validation), and a validation whose caller left stops.

Linearity is checked by counting the library's pairwise comparisons (``_utils.equal``),
not by timing: its ``uniqueItems`` compares every pair of objects (a 49 KiB ``plan.use``
took 14 CPU-seconds) and its ``enum`` every member."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import jsonschema._keywords
import jsonschema._utils
import pytest

from cleveragents.acp.facade.domain.bounded import caller_work, json_schemas

ITEMS = 2000


@pytest.fixture
def comparisons(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the library compared two values pairwise."""
    counted = [0]
    equal = jsonschema._utils.equal

    def counting(one: Any, two: Any) -> bool:
        counted[0] += 1
        return bool(equal(one, two))

    monkeypatch.setattr(jsonschema._utils, "equal", counting)
    monkeypatch.setattr(jsonschema._keywords, "equal", counting)
    return counted


def problems(schema: dict[str, Any], instance: Any) -> list[str]:
    return json_schemas.errors(json_schemas.check(schema), schema, instance)


def test_unique_items_of_objects_compares_no_pair(comparisons: list[int]) -> None:
    schema = {"type": "array", "uniqueItems": True}
    assert problems(schema, [{"a": i} for i in range(ITEMS)]) == []
    assert comparisons[0] < ITEMS


@pytest.mark.parametrize(
    ("items", "unique"),
    [
        ([{"a": 1, "b": 2}, {"b": 2, "a": 1}], False),
        ([1, 1.0], False),
        ([True, 1], True),
        ([False, 0, None, "0", [0], [False], {"0": 0}], True),
        ([[1, {"x": [True]}], [1, {"x": [True]}]], False),
        ([[1, {"x": [True]}], [1, {"x": [1]}]], True),
    ],
)
def test_unique_items_keeps_json_schema_equality(items: list[Any], unique: bool) -> None:
    found = problems({"uniqueItems": True}, items)
    assert (found == []) is unique, found
    if not unique:
        assert "non-unique elements (items 0 and 1)" in found[0]


def test_enum_of_objects_is_looked_up_not_compared(comparisons: list[int]) -> None:
    schema = {"type": "array", "items": {"enum": [{"a": i} for i in range(ITEMS)]}}
    given = [{"a": ITEMS - 1 - i % 7} for i in range(ITEMS)]
    assert problems(schema, given) == []
    assert comparisons[0] < ITEMS
    wrong = problems(schema, [{"a": -1}])
    assert len(wrong) == 1
    assert wrong[0].startswith("$[0]: {'a': -1} is not one of [")
    assert len(wrong[0]) < 200, "the message repeats the whole enum"
    assert problems({"enum": [1, True]}, 1.0) == []
    assert problems({"enum": [True]}, 1) != []


def test_a_validation_stops_at_its_step_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_schemas, "MAX_STEPS", 5000)
    schema = {"type": "array", "items": {"anyOf": [{"type": "string", "minLength": n} for n in range(20)]}}
    assert problems(schema, ["a" * 30] * 10) == []
    assert problems(schema, ["a"] * 5000) == [
        "$: checking it takes over 5000 steps of work; send a smaller document or a simpler schema"
    ]
    with pytest.raises(json_schemas.SchemaError, match="over 5000 steps"):
        json_schemas.check({"required": [f"k{n}" for n in range(6000)]})


async def test_a_validation_whose_caller_left_stops_at_its_next_step() -> None:
    work = caller_work.CallerWork(workers=2, per_namespace=1)
    started, go = threading.Event(), threading.Event()
    ended: list[BaseException | list[str]] = []
    schema = {"type": "array", "items": {"type": "string"}}

    def validate() -> list[str]:
        started.set()
        go.wait()
        try:
            found = problems(schema, ["a"] * 1000)
        except BaseException as exc:
            ended.append(exc)
            raise
        ended.append(found)
        return found

    call = asyncio.create_task(work.run("ns", validate))
    await asyncio.to_thread(started.wait)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    # Abandoned, the job still holds its namespace's place until its thread is free.
    assert work.running("ns") == 1
    go.set()
    assert await work.run("ns", lambda: "next") == "next"
    assert len(ended) == 1
    assert isinstance(ended[0], caller_work.AbandonedError)
    assert work.running("ns") == 0
    work.close()


async def test_one_namespace_cannot_fill_the_pool() -> None:
    work = caller_work.CallerWork(workers=3, per_namespace=2)
    release = threading.Event()
    entered = threading.Semaphore(0)

    def hold() -> str:
        entered.release()
        release.wait()
        return "held"

    busy = [asyncio.create_task(work.run("greedy", hold)) for _ in range(5)]
    for _ in range(2):
        await asyncio.to_thread(entered.acquire)
    assert work.running("greedy") == 2
    # A waiting job of the greedy namespace leaves the queue when its caller does.
    busy[4].cancel()
    await asyncio.gather(busy[4], return_exceptions=True)
    # Another namespace gets the third thread while the greedy one holds two and queues more.
    assert await work.run("probe", lambda: "answered") == "answered"
    assert work.running("greedy") == 2
    release.set()
    assert await asyncio.gather(*busy[:4]) == ["held"] * 4
    assert work.running("greedy") == 0
    work.close()
