"""``--value PATH`` is checked against the response's fields before any call."""

from __future__ import annotations

import pytest

from cleveragents.acp.client.cli.operations import response_descriptor
from cleveragents.acp.client.cli.value_path import problem
from cleveragents.acp.contract import catalog


@pytest.mark.parametrize(
    ("operation", "path"),
    [
        ("plan.use", "plan.meta.id"),
        ("plan.status", "plan.state"),
        ("session.create", "session.meta.id"),
        ("session.list", "sessions"),
        ("session.list", "sessions.0.meta.id"),
        ("session.create", "session.labels.team"),
        ("resource.add", "resource.name"),
        ("session.create", "session.meta.create_time"),
    ],
)
def test_paths_the_response_can_have_pass(operation: str, path: str) -> None:
    op = catalog.OPERATIONS[operation]
    assert problem(response_descriptor(op), path) is None


@pytest.mark.parametrize(
    ("operation", "path", "message"),
    [
        ("project.add", "nme", "the response has no field 'nme' (it has: project)"),
        ("plan.use", "plan.meta.idd", "plan.meta has no field 'idd'"),
        ("session.list", "sessions.x", "sessions is a list; expected an index such as sessions.0"),
        ("session.create", "session.meta.create_time.seconds", "create_time is a single value"),
    ],
)
def test_paths_it_cannot_have_are_named(operation: str, path: str, message: str) -> None:
    op = catalog.OPERATIONS[operation]
    found = problem(response_descriptor(op), path)
    assert found is not None
    assert message in found
