"""docs/server.md's "Deadlines and disconnects" table is the catalog's: every operation, in
catalog order, with what becomes of its work when the caller stops waiting."""

from __future__ import annotations

import pathlib

from cleveragents.acp.contract import catalog

ROOT = pathlib.Path(__file__).resolve().parents[2]
START = "<!-- when-abandoned table: generated from the catalog -->\n"
END = "<!-- end of the when-abandoned table -->"


def expected_table() -> str:
    rows = [f"| `{op.name}` | {op.abandoned} |" for op in catalog.OPERATIONS.values()]
    return "\n".join(["| operation | if the caller stops waiting |", "| --- | --- |", *rows]) + "\n"


def test_the_docs_table_is_the_catalogs() -> None:
    text = (ROOT / "docs" / "server.md").read_text()
    table = text.split(START, 1)[1].split(END, 1)[0]
    assert table == expected_table(), "regenerate the table:\n" + expected_table()


def test_every_mutating_operation_says_what_happens() -> None:
    ops = catalog.OPERATIONS.values()
    assert {op.name for op in ops if op.read_only and op.when_abandoned} == set()
    assert all(op.abandoned for op in ops)
    # The ones that start or finish work beyond one transaction say so in the proto.
    said = {op.name for op in ops if op.when_abandoned}
    assert said == {
        "plan.use",
        "plan.execute",
        "plan.apply",
        "plan.cancel",
        "plan.correct",
        "plan.rollback",
        "session.tell",
        "session.cancel_turn",
        "webhook.test",
        "approval.answer",
    }


def test_the_openapi_descriptions_say_it_too() -> None:
    from cleveragents.acp.gateway.http import openapi

    described = {
        spec["operationId"]: spec.get("description", "")
        for item in openapi.document()["paths"].values()
        for spec in item.values()
        if isinstance(spec, dict) and "operationId" in spec
    }
    for op in catalog.OPERATIONS.values():
        assert described[op.name].endswith(f"If the caller stops waiting: {op.abandoned}"), op.name
