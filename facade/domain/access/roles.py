"""Roles: what a principal may do, decided per call from tables built once.

A reader calls only the operations the proto marks ``NO_SIDE_EFFECTS`` (``Operation.read_only``);
a writer calls every operation; registering or changing anything that runs a process on the
server needs an admin: every tool (a tool is a command), a validation with a ``command``
check, an automation profile that allows a registered (command) tool or lists validations
in ``allowed_validations`` (the field does one thing: lets command validations run), and a
plan that runs under another profile than its action's when that profile allows more
commands.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from google.protobuf import message

from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.call import CallContext, Principal, Role
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.models.functions import BUILTIN
from cleveragents.acp.v1 import specs_pb2

# Registry kinds every entry of which runs a process: all their writes need an admin.
PROCESS_KINDS = frozenset({"tool"})
_RANK: Mapping[Role, int] = MappingProxyType({Role.READER: 0, Role.WRITER: 1, Role.ADMIN: 2})


def least_role(op: catalog.Operation) -> Role:
    """The least role that may call ``op``, derived from the catalog."""
    if op.read_only:
        return Role.READER
    if op.group in PROCESS_KINDS:
        return Role.ADMIN
    return Role.WRITER


# By operation key (``plan.status``; ``session.show@v2`` in another major).
NEEDED: Mapping[str, Role] = MappingProxyType({op.key: least_role(op) for op in catalog.CATALOG.operations()})
# (role, operation key) pairs that are allowed: one set lookup per call.
ALLOWED: frozenset[tuple[Role, str]] = frozenset(
    (role, key) for role in Role for key, needed in NEEDED.items() if _RANK[role] >= _RANK[needed]
)


def forbidden(principal: Principal, needed: Role, what: str, **details: object) -> ACPError:
    return ACPError(
        ErrorCode.AUTH_FORBIDDEN,
        f"principal {principal.name!r} has the {principal.role} role; {what} needs {needed}",
        {"principal": principal.name, "role": str(principal.role), "required_role": str(needed), **details},
        refinement="ROLE_FORBIDDEN",
    )


def check_operation(principal: Principal, op: catalog.Operation) -> None:
    """Refuse an operation the principal's role may not call (AUTH_FORBIDDEN)."""
    if (principal.role, op.key) in ALLOWED:
        return
    # Not in the table (a catalog built after start-up, as tests do): derived the same way.
    needed = NEEDED.get(op.key) or least_role(op)
    if _RANK[principal.role] < _RANK[needed]:
        raise forbidden(principal, needed, op.name, operation=op.name)


def command_tools(tools: Iterable[str]) -> list[str]:
    """The registered (command) tools among ``tools``: every one but the built-in file tools."""
    return sorted(set(tools) - BUILTIN.keys())


def allowed_commands(profile: specs_pb2.AutomationProfileSpec) -> list[str]:
    """What a profile lets run as a process: its command tools, and every validation it
    lists (``allowed_validations`` matters to command validations alone; a writer naming an
    admin's command validation there would run that command on files the writer staged)."""
    return sorted({*command_tools(profile.allowed_tools), *profile.allowed_validations})


def runs_process(kind: str, spec: message.Message | None) -> bool:
    """Whether an entry of ``kind`` with ``spec`` makes the server run a process."""
    if kind in PROCESS_KINDS:
        return True
    if isinstance(spec, specs_pb2.ValidationSpec):
        return spec.WhichOneof("check") == "command"
    if isinstance(spec, specs_pb2.AutomationProfileSpec):
        return bool(allowed_commands(spec))
    return False


def check_entry(ctx: CallContext, kind: str, verb: str, *specs: message.Message | None) -> None:
    """An admin only may write an entry whose spec (before or after) runs a process."""
    principal = ctx.require_principal()
    if principal.role is Role.ADMIN:
        return
    if any(runs_process(kind, spec) for spec in specs):
        raise forbidden(
            principal, Role.ADMIN, f"a {kind} that runs a command ({kind}.{verb})", operation=f"{kind}.{verb}"
        )


def check_profile_override(
    ctx: CallContext,
    chosen: specs_pb2.AutomationProfileSpec,
    own: specs_pb2.AutomationProfileSpec | None,
    name: str,
) -> None:
    """``plan.use`` may name another profile than the action's own, but only an admin may
    pick one that allows a command tool the action's own profile does not."""
    principal = ctx.require_principal()
    if principal.role is Role.ADMIN:
        return
    wider = sorted(set(allowed_commands(chosen)) - set(allowed_commands(own) if own else ()))
    if wider:
        raise forbidden(
            principal,
            Role.ADMIN,
            f"automation profile {name!r}, which allows commands the action's own profile does not "
            f"({', '.join(wider)}),",
            operation="plan.use",
            field="automation_profile",
        )
