"""The plan state machine: which operation is valid in which (phase, state).

One table says it; every mutating operation asks ``require`` first, so an operation
in a state where it is invalid answers INVALID_STATE naming the states it needs,
never a silent no-op.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TypeAlias

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.v1 import plan_pb2

Phase: TypeAlias = plan_pb2.PlanPhase.ValueType
State: TypeAlias = plan_pb2.PlanState.ValueType

STRATEGIZE = plan_pb2.PLAN_PHASE_STRATEGIZE
EXECUTE = plan_pb2.PLAN_PHASE_EXECUTE
APPLY = plan_pb2.PLAN_PHASE_APPLY

PENDING = plan_pb2.PLAN_STATE_PENDING
RUNNING = plan_pb2.PLAN_STATE_RUNNING
SUCCEEDED = plan_pb2.PLAN_STATE_SUCCEEDED
FAILED = plan_pb2.PLAN_STATE_FAILED
CANCELLED = plan_pb2.PLAN_STATE_CANCELLED
ROLLED_BACK = plan_pb2.PLAN_STATE_ROLLED_BACK
# PausedError before a step or an apply until a person answers (approvals.py; ACP 1.3).
AWAITING_APPROVAL = plan_pb2.PLAN_STATE_AWAITING_APPROVAL

TERMINAL: frozenset[State] = frozenset({SUCCEEDED, FAILED, CANCELLED, ROLLED_BACK})

# Error codes a plan records in ``last_error`` besides the ACP codes.
INTERRUPTED = "interrupted"
VALIDATION_FAILED = "validation_failed"
STEP_FAILED = "step_failed"
# A step replaced by a correction: cancelled, with this error code.
SUPERSEDED = "superseded"

_OPEN = (PENDING, SUCCEEDED, FAILED)

# The (phase, state) pairs in which each state-changing operation may run.
ALLOWED: Mapping[str, frozenset[tuple[Phase, State]]] = MappingProxyType(
    {
        # Strategize and execute, or execute a re-strategized plan.
        "execute": frozenset({(STRATEGIZE, PENDING), (EXECUTE, PENDING)}),
        # From a succeeded execute phase, or again after an apply that changed nothing.
        "apply": frozenset({(EXECUTE, SUCCEEDED), (APPLY, FAILED)}),
        "cancel": frozenset(
            {(p, s) for p in (STRATEGIZE, EXECUTE) for s in (PENDING, RUNNING)}
            | {(EXECUTE, AWAITING_APPROVAL)}
        ),
        # Only before apply, and never while the actor or a tool is at work.
        "correct": frozenset(
            {(p, s) for p in (STRATEGIZE, EXECUTE) for s in _OPEN} | {(EXECUTE, AWAITING_APPROVAL)}
        ),
        "rollback": frozenset({(APPLY, SUCCEEDED)}),
    }
)


# Where a step's answered approval resumes a run from (approving.py; no operation of its own).
RESUMABLE = frozenset({(EXECUTE, AWAITING_APPROVAL)})


def require_resumable(plan: plan_pb2.Plan) -> None:
    """INVALID_STATE unless the plan waits for a step's approval."""
    if (plan.phase, plan.state) not in RESUMABLE:
        raise ACPError(
            ErrorCode.INVALID_STATE,
            f"plan {plan.meta.id} is {describe(plan.phase, plan.state)}; it does not await an approval",
            {"plan_id": plan.meta.id, "phase": phase_name(plan.phase), "state": state_name(plan.state)},
        )


def superseded(step: plan_pb2.PlanStep) -> bool:
    return step.state == CANCELLED and step.error.code == SUPERSEDED


def phase_name(phase: Phase) -> str:
    return plan_pb2.PlanPhase.Name(phase).removeprefix("PLAN_PHASE_").lower()


def state_name(state: State) -> str:
    return plan_pb2.PlanState.Name(state).removeprefix("PLAN_STATE_").lower()


def describe(phase: Phase, state: State) -> str:
    return f"{phase_name(phase)}/{state_name(state)}"


def require(operation: str, plan: plan_pb2.Plan) -> None:
    """INVALID_STATE unless ``operation`` may run in the plan's current phase and state."""
    allowed = ALLOWED[operation]
    if (plan.phase, plan.state) in allowed:
        return
    needs = sorted(describe(p, s) for p, s in allowed)
    raise ACPError(
        ErrorCode.INVALID_STATE,
        f"plan {plan.meta.id} is {describe(plan.phase, plan.state)}; "
        f"plan.{operation} needs one of: {', '.join(needs)}",
        {
            "plan_id": plan.meta.id,
            "phase": phase_name(plan.phase),
            "state": state_name(plan.state),
            "operation": f"plan.{operation}",
            "allowed": needs,
        },
    )
