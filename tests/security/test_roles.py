"""Roles (issue 17, finding 2 and 11): a reader calls only the operations the proto marks
NO_SIDE_EFFECTS, a writer every operation but those that register or change what runs a
process, an admin all; refused calls are AUTH_FORBIDDEN (gRPC PERMISSION_DENIED) with
refinement ROLE_FORBIDDEN, identically on every transport (local, envelope, REST, gRPC,
and the gateway in front of gRPC).

The matrix is generated from the catalog, with an expectation written independently of
the role table it checks.
"""

from __future__ import annotations

import pathlib
from typing import Any

from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.call import Role
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.access import roles
from tests.conformance.generated import AUTH_CODES, build_world, outcome, world_request
from tests.conformance.harness import Run, run_everywhere
from tests.conformance.scenarios import folder, plan_world, use
from tests.registry_specs import registry_spec
from tests.server_process import Tokens

# Writes of these kinds register or change a command: every tool runs a process.
COMMAND_KINDS = {"tool"}


def allowed(role: str, op: Operation) -> bool:
    if role == "admin" or op.read_only:
        return True
    return role == "writer" and op.group not in COMMAND_KINDS


def assert_role_refused(err: ACPError | None, role: str, what: str) -> None:
    assert err is not None, (role, what)
    assert err.code == "AUTH_FORBIDDEN", (role, what, err)
    assert err.details["refinement"] == "ROLE_FORBIDDEN", err
    assert err.details["role"] == role, err


async def role_matrix(run: Run) -> None:
    world = await build_world(run)
    # The reader first: it changes nothing the others then find missing.
    for role in ("reader", "writer", "admin"):
        for op in catalog.OPERATIONS.values():
            err = await outcome(run, op, world_request(op, world), principal=role)
            if allowed(role, op):
                assert err is None or err.code not in AUTH_CODES, (role, op.name, err)
            else:
                assert_role_refused(err, role, op.name)


async def command_specs(run: Run) -> None:
    """Entries whose spec runs a process need an admin, whatever the operation's table
    says: a command validation, a profile allowing a command tool, a plan.use naming a
    profile wider than its action's."""
    admin, writer = run.client("admin"), run.client("writer")
    await plan_world(run)
    base = folder(run, "base")
    await admin.call("tool.add", name="sh", spec=registry_spec("tool", base))
    command = {"command": {"argv": ["sh", "-c", "id"]}}
    err = await run.fails(writer.call("validation.add", name="v", spec=command), "AUTH_FORBIDDEN")
    assert err.details["refinement"] == "ROLE_FORBIDDEN"
    await admin.call("validation.add", name="v", spec=command)
    regex = registry_spec("validation", base)
    await run.fails(writer.call("validation.update", name="v", revision=1, spec=regex), "AUTH_FORBIDDEN")
    await run.fails(writer.call("validation.remove", name="v"), "AUTH_FORBIDDEN")
    await writer.call("validation.add", name="r", spec=regex)
    await run.fails(writer.call("validation.update", name="r", revision=1, spec=command), "AUTH_FORBIDDEN")
    await writer.call("validation.update", name="r", revision=1, labels={"a": "b"}, update_mask="labels")
    wide = {"allowed_tools": ["fs.read", "sh"]}
    await run.fails(writer.call("automation_profile.add", name="wide", spec=wide), "AUTH_FORBIDDEN")
    await writer.call("automation_profile.add", name="narrow", spec={"allowed_tools": ["fs.read"]})
    await admin.call("automation_profile.add", name="wide", spec=wide)
    err = await run.fails(use(writer, automation_profile="wide"), "AUTH_FORBIDDEN")
    assert err.details["field"] == "automation_profile"
    await use(writer, automation_profile="narrow")
    await use(admin, automation_profile="wide")
    # Issue 31, finding 5: a writer's profile naming the admin's command validation "v" in
    # allowed_validations would run that command on files the writer staged.
    checks = {"allowed_tools": ["fs.read"], "allowed_validations": ["v"]}
    err = await run.fails(writer.call("automation_profile.add", name="checks", spec=checks), "AUTH_FORBIDDEN")
    assert err.details["refinement"] == "ROLE_FORBIDDEN"
    await run.fails(
        writer.call("automation_profile.update", name="narrow", revision=1, spec=checks), "AUTH_FORBIDDEN"
    )
    await admin.call("automation_profile.add", name="checks", spec=checks)
    err = await run.fails(use(writer, automation_profile="checks"), "AUTH_FORBIDDEN")
    assert "v" in err.message
    await use(admin, automation_profile="checks")


async def readers_follow_events(run: Run) -> None:
    """A reader opens event streams, with its token and with a ticket."""
    reader = run.client("reader")
    ticket: Any = await reader.call("events.ticket", namespace="default")
    assert ticket.ticket


async def test_role_matrix_over_every_operation_and_transport(
    tmp_path: pathlib.Path, role_tokens: Tokens
) -> None:
    await run_everywhere(role_matrix, tmp_path, role_tokens)


async def test_commands_need_an_admin_on_every_transport(tmp_path: pathlib.Path, role_tokens: Tokens) -> None:
    await run_everywhere(command_specs, tmp_path, role_tokens)


async def test_readers_may_ask_for_stream_tickets(tmp_path: pathlib.Path, role_tokens: Tokens) -> None:
    await run_everywhere(readers_follow_events, tmp_path, role_tokens)


def test_the_role_table_is_derived_from_the_catalog() -> None:
    for op in catalog.OPERATIONS.values():
        for role in ("reader", "writer", "admin"):
            assert ((Role(role), op.name) in roles.ALLOWED) == allowed(role, op), (role, op.name)
    assert {name for name, needed in roles.NEEDED.items() if needed == "reader"} == {
        op.name for op in catalog.OPERATIONS.values() if op.read_only
    }
