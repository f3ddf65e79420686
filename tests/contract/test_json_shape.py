"""INVALID_PARAMS names the field path and, for an unknown key, the fields there are, in
ACP's words (never protobuf's "Message type ... Available Fields(except extensions)")."""

from __future__ import annotations

from typing import Any

import pytest

from cleveragents.acp.contract import catalog, codec
from cleveragents.acp.contract.errors import ACPError


@pytest.mark.parametrize(
    ("operation", "params", "message", "path"),
    [
        (
            "project.add",
            {"name": "demo", "spec": {"resourcez": []}},
            "invalid params: spec.resourcez: ProjectSpec has no field 'resourcez' (its fields: resources)",
            "spec.resourcez",
        ),
        ("project.add", {"name": "d", "spec": {"resources": 5}}, "expected a list", "spec.resources"),
        (
            "project.add",
            {"name": "d", "spec": {"resources": [{}]}},
            "expected a string, got an object",
            "spec.resources.0",
        ),
        ("project.add", {"name": "d", "spec": "x"}, "expected an object (ProjectSpec), got a string", "spec"),
        (
            "project.add",
            {"name": "d", "labels": {"team": 1}},
            "expected a string, got a number",
            "labels.team",
        ),
        (
            "action.add",
            {"name": "a", "spec": {"actor": "scripted", "steps": [{"id": "s", "argz": {}}]}},
            "ActionStep has no field 'argz' (its fields: args, description, id, tool)",
            "spec.steps.0.argz",
        ),
        ("plan.list", {"state": "DONE"}, "expected one of PLAN_STATE_UNSPECIFIED", "state"),
        ("plan.list", {"page_size": "many"}, "expected an integer, got a string", "page_size"),
        ("plan.execute", {"plan_id": "p", "wait": "yes"}, "expected true or false, got a string", "wait"),
    ],
)
def test_misfits_name_the_path_and_what_it_takes(
    operation: str, params: dict[str, Any], message: str, path: str
) -> None:
    with pytest.raises(ACPError) as caught:
        codec.from_dict(params, catalog.OPERATIONS[operation].request_type)
    error = caught.value
    assert error.code == "INVALID_PARAMS"
    assert message in error.message
    assert error.message.startswith(f"invalid params: {path}: ")
    assert error.details["path"] == path
    assert "Message type" not in error.message
    assert "Available Fields" not in error.message


def test_an_unknown_field_lists_the_allowed_ones_in_details() -> None:
    with pytest.raises(ACPError) as caught:
        codec.from_dict(
            {"name": "d", "spec": {"resourcez": []}}, catalog.OPERATIONS["project.add"].request_type
        )
    assert caught.value.details["allowed"] == ["resources"]


def test_a_value_the_shape_allows_keeps_the_parsers_reason_on_one_line() -> None:
    with pytest.raises(ACPError) as caught:
        codec.from_dict({"page_size": 2**40}, catalog.OPERATIONS["plan.list"].request_type)
    assert caught.value.code == "INVALID_PARAMS"
    assert "\n" not in caught.value.message
