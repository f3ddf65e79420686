"""``PlanCorrector``: ``plan.correct``, a user's correction at a decision node (before apply).

The corrected branch is superseded (its steps and their staged changes dropped) and the
plan strategizes again from it: a scripted actor at once, a model at the next execute,
with the correction in its conversation. Either way the plan ends pending Execute, and
starts when its profile executes by itself.
"""

from __future__ import annotations

import asyncio

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.plans import actor, approvals, halts, model, setup
from cleveragents.acp.facade.domain.plans.halts import HaltError
from cleveragents.acp.facade.domain.plans.model_actor import ModelActor
from cleveragents.acp.facade.domain.plans.recording import PlanRecorder
from cleveragents.acp.facade.domain.plans.records import Change
from cleveragents.acp.facade.domain.plans.running import PlanRunner
from cleveragents.acp.v1 import plan_pb2

Corrected = tuple[plan_pb2.Plan, plan_pb2.DecisionNode]


class PlanCorrector:
    def __init__(self, recorder: PlanRecorder, runner: PlanRunner) -> None:
        self.recorder = recorder
        self.records = recorder.records
        self.registries = recorder.registries
        self.runner = runner

    async def correct(self, ctx: CallContext, request: plan_pb2.CorrectPlanRequest) -> Corrected:
        recorder = self.recorder
        plan, nodes, plan_setup, corrections, steps = await recorder.read(
            lambda: self._correction_of(ctx, request)
        )
        runner = recorder.model_of(plan_setup)
        if runner is not None:
            return await self._correct_model(plan, plan_setup, runner, nodes, corrections, request)
        strategy, node = actor.correct(nodes, steps, request, len(corrections) + 1, plan.action, plan.project)

        def check_overrides() -> None:
            for index, override in enumerate(request.overrides):
                if override.tool:
                    try:
                        setup.tool_spec(self.registries, plan.meta.namespace, override.tool)
                    except ACPError as exc:
                        raise ACPError(
                            ErrorCode.INVALID_PARAMS, exc.message, {"field": f"overrides[{index}].tool"}
                        ) from None

        await recorder.read(check_overrides)
        texts = [c.text for c in [*corrections, request] if c.text]
        # Off the loop: the prompt's context walks the project's folder.
        given = await asyncio.to_thread(actor.prompt, plan_setup, actor.as_dict(plan.inputs), texts)
        plan.ClearField("last_error")

        def record() -> None:
            recorder.still(plan, "correct")
            approvals.void_pending(recorder, plan, "the plan was corrected")
            self.records.add_correction(plan.meta.id, request)
            kept = [c for c in self.records.changes(plan.meta.id) if c.step_id not in strategy.discarded]
            self.records.save_changes(plan.meta.id, kept)
            self.records.save_prompt(plan.meta.id, given)
            recorder.transition(plan, model.STRATEGIZE, model.RUNNING, reason="correction")
            recorder.record_strategy(plan, strategy)

        await recorder.write(record)
        try:
            halts.charge(plan, actor.usage_cost(plan_setup, given), "the actor's usage")
        except HaltError as halt:
            error = halt.error
            await recorder.write(
                lambda: recorder.transition(plan, model.STRATEGIZE, model.FAILED, error=error)
            )
            return plan, await recorder.read(lambda: recorder.node(plan.meta.id, node.id))

        def settle() -> None:
            recorder.transition(plan, model.STRATEGIZE, model.SUCCEEDED, reason="correction")
            recorder.transition(plan, model.EXECUTE, model.PENDING, reason="correction")

        await recorder.write(settle)
        if plan_setup.profile.auto_execute:
            await self.runner.start(plan)
        return await recorder.read(
            lambda: (self.records.load(plan.meta.id), recorder.node(plan.meta.id, node.id))
        )

    def _correction_of(
        self, ctx: CallContext, request: plan_pb2.CorrectPlanRequest
    ) -> tuple[
        plan_pb2.Plan,
        list[plan_pb2.DecisionNode],
        setup.PlanSetup,
        list[plan_pb2.CorrectPlanRequest],
        list[plan_pb2.PlanStep],
    ]:
        """What a correction starts from, read in one snapshot."""
        plan = self.recorder.load(ctx, request.plan_id)
        model.require("correct", plan)
        nodes = self.records.nodes(plan.meta.id)
        if not nodes:
            raise ACPError(
                ErrorCode.INVALID_STATE,
                f"plan {plan.meta.id} has no decision tree yet; execute it first",
                {"plan_id": plan.meta.id, "operation": "plan.correct"},
            )
        return (
            plan,
            nodes,
            self.recorder.setup_of(plan),
            self.records.corrections(plan.meta.id),
            self.records.steps(plan.meta.id),
        )

    async def _correct_model(
        self,
        plan: plan_pb2.Plan,
        plan_setup: setup.PlanSetup,
        runner: ModelActor,
        nodes: list[plan_pb2.DecisionNode],
        corrections: list[plan_pb2.CorrectPlanRequest],
        request: plan_pb2.CorrectPlanRequest,
    ) -> Corrected:
        """``plan.correct`` of a model plan: it goes back to just before the corrected decision
        (decisions, steps, staged changes and conversation), and the next execute asks the model
        again with the correction in the conversation."""
        recorder, records = self.recorder, self.records
        plan_id = plan.meta.id
        steps, conversation = await recorder.read(
            lambda: (records.steps(plan_id), records.conversation(plan_id))
        )
        strategy, node = runner.correct(nodes, steps, conversation, request, len(corrections) + 1)
        texts = [c.text for c in [*corrections, request] if c.text]
        given = runner.prompt(plan_setup, actor.as_dict(plan.inputs), texts)
        plan.ClearField("last_error")

        def record() -> None:
            recorder.still(plan, "correct")
            approvals.void_pending(recorder, plan, "the plan was corrected")
            records.add_correction(plan_id, request)
            kept: list[Change] = [c for c in records.changes(plan_id) if c.step_id not in strategy.discarded]
            records.save_changes(plan_id, kept)
            records.save_prompt(plan_id, given)
            records.save_conversation(plan_id, strategy.conversation or [])
            recorder.transition(plan, model.STRATEGIZE, model.RUNNING, reason="correction")
            recorder.record_strategy(plan, strategy)
            recorder.transition(plan, model.STRATEGIZE, model.SUCCEEDED, reason="correction")
            recorder.transition(plan, model.EXECUTE, model.PENDING, reason="correction")

        await recorder.write(record)
        if plan_setup.profile.auto_execute:
            await self.runner.start(plan)
        return await recorder.read(lambda: (records.load(plan_id), recorder.node(plan_id, node.id)))
