"""``StepRunner``: Execute's work, the plan's steps as tool calls, then its validations.

A step is saved running with ``tool.invoked`` before its tool runs and saved with its
outcome, its staged changes and ``tool.completed`` after, one row each time, so a step
costs the same in a plan of any length. A failed step halts the plan (``HaltError``), or,
for a model's call, goes back to the model. The run checks the cancel flag between steps.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from cleveragents.acp.facade.domain.access.policy import HOW_TO_ALLOW_COMMANDS
from cleveragents.acp.facade.domain.plans import (
    actor,
    approvals,
    halts,
    model,
    records,
    setup,
    tools,
    validations,
)
from cleveragents.acp.facade.domain.plans.approvals import ApprovalGate
from cleveragents.acp.facade.domain.plans.halts import Cancels, HaltError
from cleveragents.acp.facade.domain.plans.recording import PlanRecorder
from cleveragents.acp.facade.domain.plans.staging import Staging
from cleveragents.acp.facade.domain.registries.specs import DEFAULT_MAX_STEPS
from cleveragents.acp.facade.domain.tracing import traced
from cleveragents.acp.v1 import common_pb2, events_pb2, plan_pb2, specs_pb2


def _index_of(steps: Sequence[plan_pb2.PlanStep], step: plan_pb2.PlanStep) -> int:
    """Where ``step`` (this very object) sits; a model's call is among the last added."""
    for index in range(len(steps) - 1, -1, -1):
        if steps[index] is step:
            return index
    raise ValueError(f"step {step.id!r} is not in the plan's steps")


class StepRunner:
    def __init__(self, recorder: PlanRecorder, cancels: Cancels, gate: ApprovalGate) -> None:
        self.recorder = recorder
        self.gate = gate
        self.records = recorder.records
        self.registries = recorder.registries
        self.cancels = cancels

    async def run_all(self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup, cancel: asyncio.Event) -> None:
        """A scripted plan's steps, in order, those already done skipped."""
        steps, staging = await self.recorder.read(
            lambda: (self.records.steps(plan.meta.id), self.recorder.staging(plan, plan_setup))
        )
        limit = plan_setup.profile.max_steps or DEFAULT_MAX_STEPS
        position = 0
        for index, step in enumerate(steps):
            if model.superseded(step):
                continue
            position += 1
            if step.state == model.SUCCEEDED:
                continue
            # Between steps the loop serves everyone else's calls, however long the plan.
            await asyncio.sleep(0)
            self.cancels.check(plan.meta.id, cancel)
            if position > limit:
                set_by = "the automation profile allows" if plan_setup.profile.max_steps else "the default is"
                raise halts.over_budget(f"step {step.id!r} would be step {position}; {set_by} {limit}")
            await self.run(plan, plan_setup, staging, steps, step, cancel, index=index)

    @traced(
        "plan.tool_call", lambda self, plan, setup, staging, steps, step, *_, **__: {"acp.tool": step.tool}
    )
    async def run(
        self,
        plan: plan_pb2.Plan,
        plan_setup: setup.PlanSetup,
        staging: Staging,
        steps: list[plan_pb2.PlanStep],
        step: plan_pb2.PlanStep,
        cancel: asyncio.Event,
        *,
        halt: bool = True,
        index: int | None = None,
    ) -> events_pb2.ToolCompleted:
        """Run one step; a failed step halts the plan, or with ``halt`` False (a model's
        call, whose failure goes back to the model) is recorded and returned.

        ``index`` is the step's place in ``steps`` (found from the end when not given):
        each save writes that one row, so a step costs the same in a plan of any length."""
        if index is None:
            index = _index_of(steps, step)
        if not setup.tool_allowed(plan_setup.profile, step.tool):
            raise HaltError(
                model.FAILED,
                "tool_not_allowed",
                f"step {step.id!r}: tool {step.tool!r} is not allowed by the automation profile "
                f"{plan_setup.profile_name or '(none)'}",
            )
        gate = await self.gate.step(plan, plan_setup, step)
        if gate.approval is not None:
            raise approvals.PausedError(gate.approval)
        if gate.rejected:
            return await self._rejected(plan, index, step, gate.rejected, halt=halt)
        spec = await self.recorder.write(lambda: self._begin(plan, index, step))
        started = time.monotonic()
        failure: tools.StepError | None = None
        try:
            if spec is None:
                # The built-in fs tools resolve and read the project's files: a worker thread's
                # work (this plan's task is the only user of its staging meanwhile).
                outcome = await asyncio.to_thread(
                    tools.run_builtin, step.tool, staging, actor.as_dict(step.args), step.id
                )
            else:
                outcome = await tools.run_command(
                    step.tool,
                    spec,
                    staging,
                    actor.as_dict(step.args),
                    step.id,
                    cancel,
                    self.registries.policy,
                )
        except tools.StepError as exc:
            failure = exc
        step.duration_ms = (time.monotonic() - started) * 1000
        price = spec.cost if spec is not None else 0.0
        # A command tool costs its price per invocation, whatever the outcome.
        plan.cost.spent += price
        completed = events_pb2.ToolCompleted(step_id=step.id, tool=step.tool, duration_ms=step.duration_ms)
        if failure is not None:
            cancelled = failure.code == "cancelled"
            step.state = model.CANCELLED if cancelled else model.FAILED
            step.error.CopyFrom(common_pb2.ErrorInfo(code=failure.code, message=failure.message))
            completed.ok = False
            completed.error.CopyFrom(step.error)
            completed.result.CopyFrom(actor.struct(failure.result))
            await self.recorder.write(lambda: self._end(plan, index, step, completed, []))
            if cancelled:
                self.cancels.check(plan.meta.id, cancel)
            if not halt:
                return completed
            raise HaltError(
                model.FAILED, model.STEP_FAILED, f"step {step.id!r} ({step.tool}) failed: {failure.message}"
            )
        step.state = model.SUCCEEDED
        completed.ok = True
        completed.result.CopyFrom(actor.struct(outcome.result))
        for change in outcome.changes:
            staging.record(change)
        # The step was running, so it was not counted done: progress moves by one.
        plan.progress.done += 1
        await self.recorder.write(lambda: self._end(plan, index, step, completed, outcome.changes))
        return completed

    async def _rejected(
        self, plan: plan_pb2.Plan, index: int, step: plan_pb2.PlanStep, why: str, *, halt: bool
    ) -> events_pb2.ToolCompleted:
        """A step the approval policy or a person refused: it does not run and fails
        ``approval_rejected``; a scripted plan halts, a model is told."""
        message = f"step {step.id!r} ({step.tool}) was not run: {why}"
        step.state = model.FAILED
        step.error.CopyFrom(common_pb2.ErrorInfo(code=approvals.REJECTED_CODE, message=message))
        await self.recorder.write(lambda: self.records.save_step(plan.meta.id, index, step))
        if halt:
            raise HaltError(model.FAILED, approvals.REJECTED_CODE, message)
        return events_pb2.ToolCompleted(step_id=step.id, tool=step.tool, ok=False, error=step.error)

    def _begin(self, plan: plan_pb2.Plan, index: int, step: plan_pb2.PlanStep) -> specs_pb2.ToolSpec | None:
        """The step's tool (None: built in), once it may run; the step saved running and
        ``tool.invoked`` published. A refusal halts the plan and writes nothing."""
        spec = setup.tool_spec(self.registries, plan.meta.namespace, step.tool)
        if spec is not None and not self.registries.policy.allow_commands:
            raise HaltError(
                model.FAILED,
                "commands_disabled",
                f"step {step.id!r}: tool {step.tool!r} runs a command; this server runs no commands "
                f"({HOW_TO_ALLOW_COMMANDS})",
            )
        price = spec.cost if spec is not None else 0.0
        left = halts.budget_left(plan)
        if left is not None and price > left:
            raise halts.over_budget(
                f"step {step.id!r} costs {price:g}; only {max(left, 0):g} of the budget "
                f"{plan.cost.budget:g} is left"
            )
        step.state = model.RUNNING
        with self.recorder.store.transaction():
            self.records.save_step(plan.meta.id, index, step)
            self.recorder.publish(
                plan, tool_invoked=events_pb2.ToolInvoked(step_id=step.id, tool=step.tool, args=step.args)
            )
        return spec

    def _end(
        self,
        plan: plan_pb2.Plan,
        index: int,
        step: plan_pb2.PlanStep,
        completed: events_pb2.ToolCompleted,
        changes: Sequence[records.Change],
    ) -> None:
        """The step's outcome, its staged changes and the plan, with ``tool.completed``."""
        with self.recorder.store.transaction():
            self.records.add_changes(plan.meta.id, changes)
            self.records.save_step(plan.meta.id, index, step)
            self.records.save(plan)
            self.recorder.publish(plan, tool_completed=completed)

    async def validate(self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup, cancel: asyncio.Event) -> None:
        """The action's validations over the staged artifacts; any failure halts the plan."""
        checks, staging = await self.recorder.read(
            lambda: (
                setup.validations(self.registries, plan.meta.namespace, plan_setup.action),
                self.recorder.staging(plan, plan_setup),
            )
        )
        # The project's files are read on a worker thread, as apply reads them.
        artifacts = await asyncio.to_thread(staging.artifacts)
        results: list[events_pb2.ValidationCompleted] = []
        for name, spec in checks:
            self.cancels.check(plan.meta.id, cancel)
            result = validations.refused(
                name, spec, self.registries.policy, plan_setup.profile
            ) or await validations.run(
                plan.meta.namespace, name, spec, staging, artifacts, cancel, self.registries.policy
            )
            results.append(result)
            await self.recorder.write(lambda: self._record_validation(plan, results))
        failed = [r for r in results if not r.passed]
        if failed:
            self.cancels.check(plan.meta.id, cancel)
            messages = [f"{r.validation}: {m}" for r in failed for m in r.messages]
            raise HaltError(
                model.FAILED, model.VALIDATION_FAILED, "validation failed: " + "; ".join(messages)
            )

    def _record_validation(self, plan: plan_pb2.Plan, results: list[events_pb2.ValidationCompleted]) -> None:
        """The results so far, with ``validation.completed`` for the newest."""
        with self.recorder.store.transaction():
            self.records.save_validations(plan.meta.id, results)
            self.recorder.publish(plan, validation_completed=results[-1])
