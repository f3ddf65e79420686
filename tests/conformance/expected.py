"""The errors each operation can answer, derived from the catalog where the contract says
them (auth, versions, required fields, lists, registries, ids) and named below for what
only the domain rules say. ``test_coverage`` checks the suite provoked every one of them.

A refinement of ``None`` accepts the code with any refinement (or none).
"""

from __future__ import annotations

from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.required import required_fields
from tests.conformance.scenarios import REGISTRY_KINDS
from tests.conformance.webhook_cases import WEBHOOK_DOMAIN

Expected = tuple[str, str, str | None]

# Domain rules the descriptors do not carry.
DOMAIN: dict[str, list[tuple[str, str | None]]] = {
    "session.tell": [("INVALID_STATE", None)],
    "session.resume": [("INVALID_STATE", None)],
    "session.import": [("ALREADY_EXISTS", "SESSION_ALREADY_EXISTS")],
    "context.show": [("NOT_FOUND", "PROJECT_NOT_FOUND"), ("INVALID_PARAMS", None)],
    "context.set": [("NOT_FOUND", "PROJECT_NOT_FOUND")],
    "context.simulate": [("NOT_FOUND", "PROJECT_NOT_FOUND"), ("INVALID_PARAMS", None)],
    "context.inspect": [("NOT_FOUND", "PROJECT_NOT_FOUND"), ("NOT_FOUND", "CONTEXT_ITEM_NOT_FOUND")],
    "project.resolve": [("NOT_FOUND", "PROJECT_NOT_FOUND")],
    "plan.use": [
        ("NOT_FOUND", "ACTION_NOT_FOUND"),
        ("NOT_FOUND", "PROJECT_NOT_FOUND"),
        ("NOT_FOUND", "SESSION_NOT_FOUND"),
        ("NOT_FOUND", "AUTOMATION_PROFILE_NOT_FOUND"),
    ],
    "plan.execute": [("INVALID_STATE", None)],
    "plan.apply": [("INVALID_STATE", None)],
    "plan.cancel": [("INVALID_STATE", None)],
    "plan.correct": [("INVALID_STATE", None)],
    "plan.rollback": [("INVALID_STATE", None)],
    "plan.prompt": [("INVALID_STATE", None)],
    "approval.show": [("NOT_FOUND", "APPROVAL_NOT_FOUND")],
    "approval.answer": [("NOT_FOUND", "APPROVAL_NOT_FOUND"), ("INVALID_STATE", "APPROVAL_DECIDED")],
    # A live subscriber that falls behind is ended (tests/conformance/test_streaming.py).
    "events.subscribe": [("BUDGET_EXCEEDED", "SUBSCRIBER_TOO_SLOW"), ("INVALID_PARAMS", None)],
    **WEBHOOK_DOMAIN,
}


def expected_errors() -> set[Expected]:
    found: set[Expected] = set()
    for op in catalog.OPERATIONS.values():
        fields = op.request_type.DESCRIPTOR.fields_by_name
        found.add((op.name, "VERSION_MISMATCH", None))
        if not op.anonymous:
            found.add((op.name, "AUTH_REQUIRED", None))
            # Refused a namespace the caller names, or a change its role may not make; a
            # subject of another namespace reached by id answers NOT_FOUND instead.
            if "namespace" in fields or not op.read_only:
                found.add((op.name, "AUTH_FORBIDDEN", None))
        if required_fields(op.request_type.DESCRIPTOR) or "page_token" in fields:
            found.add((op.name, "INVALID_PARAMS", None))
        if op.group in REGISTRY_KINDS:
            kind = op.group.upper()
            if op.verb in ("show", "update", "remove"):
                found.add((op.name, "NOT_FOUND", f"{kind}_NOT_FOUND"))
            if op.verb in ("update", "remove"):
                found.add((op.name, "INVALID_STATE", None))
            if op.verb == "add":
                found.add((op.name, "ALREADY_EXISTS", f"{kind}_ALREADY_EXISTS"))
        if "plan_id" in {f.name for f in required_fields(op.request_type.DESCRIPTOR)}:
            found.add((op.name, "NOT_FOUND", "PLAN_NOT_FOUND"))
        if "session_id" in fields and op.group in ("session", "context"):
            found.add((op.name, "NOT_FOUND", "SESSION_NOT_FOUND"))
        for code, refinement in DOMAIN.get(op.name, []):
            found.add((op.name, code, refinement))
    return found


def missing(observed: set[tuple[str, str, str]]) -> list[Expected]:
    """Expected errors no observation matches."""
    return sorted(
        (e for e in expected_errors() if not any(o[:2] == e[:2] and e[2] in (None, o[2]) for o in observed)),
        key=str,
    )
