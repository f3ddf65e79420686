"""What stops a running plan: a budget crossed, a failure, or a cancel.

``HaltError`` carries the state the plan ends in and the error it records; the run loop
(running.py) writes both. ``Cancels`` holds the cancel flag of each plan this process
runs, and why it was set: ``plan.cancel``, a cancel left on the plan's lease by another
process, or a lost lease (leasing.py) set it; the run checks it at every step boundary.
"""

from __future__ import annotations

import asyncio
from typing import NoReturn

from cleveragents.acp.contract.errors import ErrorCode
from cleveragents.acp.facade.domain.plans import model
from cleveragents.acp.v1 import common_pb2, plan_pb2

BUDGET_EXCEEDED = ErrorCode.Name(ErrorCode.BUDGET_EXCEEDED)


class HaltError(Exception):
    """Stops a running plan: the state it ends in and the error it records."""

    def __init__(self, state: model.State, code: str, message: str) -> None:
        super().__init__(message)
        self.state = state
        self.error = common_pb2.ErrorInfo(code=code, message=message)


def fail(code: str, message: str) -> NoReturn:
    raise HaltError(model.FAILED, code, message)


def over_budget(message: str) -> HaltError:
    return HaltError(model.FAILED, BUDGET_EXCEEDED, message)


def charge(plan: plan_pb2.Plan, amount: float, what: str) -> None:
    """Add spent cost; crossing the budget halts the plan."""
    plan.cost.spent += amount
    if plan.cost.budget and plan.cost.spent > plan.cost.budget:
        raise over_budget(
            f"{what} brought the cost to {plan.cost.spent:g}, over the budget of {plan.cost.budget:g}"
        )


def budget_left(plan: plan_pb2.Plan) -> float | None:
    return plan.cost.budget - plan.cost.spent if plan.cost.budget else None


class Cancels:
    """The cancel flag (and its reason) of each plan this process runs."""

    def __init__(self) -> None:
        self._flags: dict[str, asyncio.Event] = {}
        self._reasons: dict[str, str] = {}

    def open(self, plan_id: str) -> asyncio.Event:
        """A fresh flag for a run that starts."""
        flag = self._flags[plan_id] = asyncio.Event()
        return flag

    def flag(self, plan_id: str) -> asyncio.Event:
        return self._flags[plan_id]

    def forget(self, plan_id: str) -> None:
        """The run is over (or never started)."""
        self._flags.pop(plan_id, None)
        self._reasons.pop(plan_id, None)

    def reason(self, plan_id: str) -> str:
        return self._reasons.get(plan_id, "")

    def request(self, plan_id: str, reason: str) -> None:
        """``plan.cancel`` of a plan this process runs: the latest reason wins."""
        self._reasons[plan_id] = reason
        self._flags[plan_id].set()

    def stop(self, plan_id: str, reason: str) -> None:
        """Stop the plan's run, if this process runs it and nothing stopped it yet."""
        flag = self._flags.get(plan_id)
        if flag is not None and not flag.is_set():
            self._reasons[plan_id] = reason
            flag.set()

    def check(self, plan_id: str, flag: asyncio.Event) -> None:
        """At a step boundary: halt CANCELLED once the run's flag is set."""
        if flag.is_set():
            raise HaltError(model.CANCELLED, "cancelled", self._reasons.get(plan_id) or "cancelled")
