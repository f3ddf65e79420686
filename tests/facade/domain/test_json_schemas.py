"""JSON Schemas run with RE2: every keyword that matches a pattern, checked once, and the
library's own answers kept for everything else."""

from __future__ import annotations

import time
from typing import Any

import jsonschema
import pytest

from cleveragents.acp.facade.domain.bounded import json_schemas

QUICK_SECONDS = 2.0
EVIL = "^(a+)+$"
LONG = "a" * 5000 + "!"

# Each keyword that matches a pattern, with an instance whose match would backtrack for ages.
PATHOLOGICAL: list[tuple[dict[str, Any], Any]] = [
    ({"properties": {"x": {"pattern": EVIL}}}, {"x": LONG}),
    ({"patternProperties": {EVIL: {"type": "integer"}}}, {LONG: "s"}),
    ({"patternProperties": {EVIL: {}}, "additionalProperties": False}, {LONG: 1}),
    ({"patternProperties": {EVIL: {}}, "unevaluatedProperties": False}, {LONG: 1}),
    (
        {
            "allOf": [{"$ref": "#/$defs/p"}],
            "unevaluatedProperties": False,
            "$defs": {"p": {"patternProperties": {EVIL: {}}}},
        },
        {LONG: 1},
    ),
    (
        {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "patternProperties": {EVIL: {}},
            "additionalProperties": False,
        },
        {LONG: 1},
    ),
    (
        {
            "$schema": "https://json-schema.org/draft/2019-09/schema",
            "patternProperties": {EVIL: {}},
            "unevaluatedProperties": False,
        },
        {LONG: 1},
    ),
]


@pytest.mark.parametrize(("schema", "instance"), PATHOLOGICAL)
def test_every_pattern_keyword_runs_in_linear_time(schema: dict[str, Any], instance: Any) -> None:
    validator_class = json_schemas.check(schema)
    began = time.monotonic()
    json_schemas.errors(validator_class, schema, instance)
    assert time.monotonic() - began < QUICK_SECONDS


# Ordinary schemas: the answers are the library's, word for word.
ORDINARY: list[tuple[dict[str, Any], Any]] = [
    ({"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]+$"}}}, {"name": "Bad1"}),
    ({"properties": {"name": {"pattern": "^[a-z]+$"}}}, {"name": "good"}),
    ({"patternProperties": {"^x-": {"type": "integer"}}}, {"x-a": "s", "y": 1}),
    (
        {"properties": {"a": {}}, "patternProperties": {"^x-": {}}, "additionalProperties": False},
        {"a": 1, "x-b": 2, "c": 3, "d": 4},
    ),
    ({"properties": {"a": {}}, "additionalProperties": False}, {"a": 1, "c": 3}),
    ({"properties": {"a": {}}, "additionalProperties": {"type": "string"}}, {"a": 1, "c": 3}),
    ({"patternProperties": {"^x": {}}, "unevaluatedProperties": False}, {"xa": 1, "y": 2, "z": 3}),
    ({"allOf": [{"properties": {"a": {}}}], "unevaluatedProperties": {"type": "string"}}, {"a": 1, "b": 2}),
    (
        {
            "if": {"properties": {"k": {"const": 1}}},
            "then": {"patternProperties": {"^t": {}}},
            "else": {"properties": {"e": {}}},
            "unevaluatedProperties": False,
        },
        {"k": 1, "t1": 0, "e": 0},
    ),
    (
        {
            "dependentSchemas": {"d": {"properties": {"dd": {}}}},
            "properties": {"d": {}},
            "unevaluatedProperties": False,
        },
        {"d": 1, "dd": 2, "x": 3},
    ),
]


@pytest.mark.parametrize(("schema", "instance"), ORDINARY)
def test_ordinary_schemas_answer_as_the_library_does(schema: dict[str, Any], instance: Any) -> None:
    library = jsonschema.validators.validator_for(schema)(schema)
    expected = sorted(f"{e.json_path}: {e.message}" for e in library.iter_errors(instance))
    assert sorted(json_schemas.errors(json_schemas.check(schema), schema, instance)) == expected


@pytest.mark.parametrize(
    ("schema", "where", "reason"),
    [
        ({"properties": {"x": {"pattern": "(a)\\1"}}}, "properties/x/pattern", "backreferences (\\1)"),
        ({"patternProperties": {"(?=x)": {}}}, "patternProperties", "lookahead ((?=...))"),
        ({"$defs": {"d": {"pattern": "(?<!a)b"}}}, "$defs/d/pattern", "lookbehind ((?<!...))"),
        ({"items": {"pattern": "\\z"}}, "items/pattern", "\\z is not an escape"),
        ({"type": 5}, "type", "is not valid under any of the given schemas"),
    ],
)
def test_a_schema_that_cannot_run_is_refused_where_it_fails(
    schema: dict[str, Any], where: str, reason: str
) -> None:
    with pytest.raises(json_schemas.SchemaError) as caught:
        json_schemas.check(schema)
    assert caught.value.where == where
    assert reason in caught.value.message


def test_a_draft_4_pattern_property_the_metaschema_does_not_check_fails_validation_clearly() -> None:
    # Draft 4's metaschema does not mark patternProperties names as regexes.
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "patternProperties": {"(?=x)": {}}}
    [problem] = json_schemas.errors(json_schemas.check(schema), schema, {"a": 1})
    assert problem.startswith("$: the pattern '(?=x)' cannot be used: lookahead ((?=...)) is not supported")


@pytest.mark.parametrize("ref", ["#/nowhere", "https://example.invalid/schema.json"])
def test_a_ref_that_leads_nowhere_is_a_problem_of_the_instance_not_a_fault(ref: str) -> None:
    schema = {"properties": {"x": {"$ref": ref}}}
    [problem] = json_schemas.errors(json_schemas.check(schema), schema, {"x": 1})
    assert problem.startswith("$: the schema's $ref '")
    assert problem.endswith("' cannot be resolved")
    assert ref.lstrip("#") in problem
