"""plan.*: handlers over ``PlanEngine``, which authorizes each plan as it loads it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.facade.domain.plans import model
from cleveragents.acp.facade.domain.plans.engine import PlanEngine
from cleveragents.acp.facade.handlers.table import handles
from cleveragents.acp.v1 import plan_pb2

T = TypeVar("T")


def _explain(plan: plan_pb2.Plan, nodes: list[plan_pb2.DecisionNode], steps: list[plan_pb2.PlanStep]) -> str:
    """The tree as indented text, children under parents, superseded branches marked, each
    decision with the steps it produced."""
    lines = [f"Plan {plan.meta.id}: action {plan.action!r} on project {plan.project!r}"]
    by_id = {step.id: step for step in steps}
    children: dict[str, list[plan_pb2.DecisionNode]] = {}
    for node in nodes:
        children.setdefault(node.parent_id, []).append(node)

    def walk(parent: str, depth: int) -> None:
        for node in children.get(parent, []):
            pad = "  " * depth
            mark = " [superseded]" if node.superseded else ""
            lines.append(f"{pad}- {node.question}{mark} (decision {node.id}, event {node.event_sequence})")
            considered = ", ".join(o.label for o in node.options)
            lines.append(f"{pad}  considered: {considered}")
            lines.append(f"{pad}  chose: {node.choice}")
            lines.append(f"{pad}  because: {node.rationale}")
            if node.correction:
                lines.append(f"{pad}  correction: {node.correction}")
            made = [by_id[i] for i in node.step_ids if i in by_id]
            if made:
                shown = ", ".join(f"{s.id} ({s.tool}, {model.state_name(s.state)})" for s in made)
                lines.append(f"{pad}  steps: {shown}")
            walk(node.id, depth + 1)

    walk("", 0)
    return "\n".join(lines) + "\n"


class PlanHandlers:
    def __init__(self, engine: PlanEngine) -> None:
        self.engine = engine

    async def _read(self, fn: Callable[[], T]) -> T:
        """A read-only answer from one snapshot, built on a store thread (off the loop)."""
        return await self.engine.store.read(lambda _store: fn())

    @handles("plan.use")
    async def UsePlan(self, request: plan_pb2.UsePlanRequest, ctx: CallContext) -> plan_pb2.UsePlanResponse:
        return plan_pb2.UsePlanResponse(plan=await self.engine.use(ctx, request))

    @handles("plan.execute")
    async def ExecutePlan(
        self, request: plan_pb2.ExecutePlanRequest, ctx: CallContext
    ) -> plan_pb2.ExecutePlanResponse:
        plan = await self.engine.execute(ctx, request.plan_id, wait=request.wait)
        return plan_pb2.ExecutePlanResponse(plan=plan)

    @handles("plan.apply")
    async def ApplyPlan(
        self, request: plan_pb2.ApplyPlanRequest, ctx: CallContext
    ) -> plan_pb2.ApplyPlanResponse:
        plan, changed = await self.engine.apply(ctx, request.plan_id, request.diff_digest)
        return plan_pb2.ApplyPlanResponse(plan=plan, changed_paths=changed)

    @handles("plan.cancel")
    async def CancelPlan(
        self, request: plan_pb2.CancelPlanRequest, ctx: CallContext
    ) -> plan_pb2.CancelPlanResponse:
        plan = await self.engine.cancel(ctx, request.plan_id, reason=request.reason)
        return plan_pb2.CancelPlanResponse(plan=plan)

    @handles("plan.status")
    async def GetPlanStatus(
        self, request: plan_pb2.GetPlanStatusRequest, ctx: CallContext
    ) -> plan_pb2.GetPlanStatusResponse:
        return plan_pb2.GetPlanStatusResponse(
            plan=await self._read(lambda: self.engine.load(ctx, request.plan_id))
        )

    @handles("plan.tree")
    async def GetPlanTree(
        self, request: plan_pb2.GetPlanTreeRequest, ctx: CallContext
    ) -> plan_pb2.GetPlanTreeResponse:
        def tree() -> plan_pb2.GetPlanTreeResponse:
            plan = self.engine.load(ctx, request.plan_id)
            records = self.engine.records
            return plan_pb2.GetPlanTreeResponse(
                nodes=records.nodes(plan.meta.id), steps=records.steps(plan.meta.id)
            )

        return await self._read(tree)

    @handles("plan.explain")
    async def ExplainPlan(
        self, request: plan_pb2.ExplainPlanRequest, ctx: CallContext
    ) -> plan_pb2.ExplainPlanResponse:
        def explain() -> plan_pb2.ExplainPlanResponse:
            plan = self.engine.load(ctx, request.plan_id)
            nodes = self.engine.records.nodes(plan.meta.id)
            steps = self.engine.records.steps(plan.meta.id)
            return plan_pb2.ExplainPlanResponse(text=_explain(plan, nodes, steps), decisions=nodes)

        return await self._read(explain)

    @handles("plan.correct")
    async def CorrectPlan(
        self, request: plan_pb2.CorrectPlanRequest, ctx: CallContext
    ) -> plan_pb2.CorrectPlanResponse:
        plan, node = await self.engine.correct(ctx, request)
        return plan_pb2.CorrectPlanResponse(plan=plan, node=node)

    @handles("plan.diff")
    async def GetPlanDiff(
        self, request: plan_pb2.GetPlanDiffRequest, ctx: CallContext
    ) -> plan_pb2.GetPlanDiffResponse:
        return await self._read(lambda: self.engine.diff(self.engine.load(ctx, request.plan_id)))

    @handles("plan.artifacts")
    async def ListPlanArtifacts(
        self, request: plan_pb2.ListPlanArtifactsRequest, ctx: CallContext
    ) -> plan_pb2.ListPlanArtifactsResponse:
        artifacts = await self._read(lambda: self.engine.artifacts(self.engine.load(ctx, request.plan_id)))
        return plan_pb2.ListPlanArtifactsResponse(
            artifacts=[a.to_proto(include_content=request.include_content) for a in artifacts]
        )

    @handles("plan.prompt")
    async def GetPlanPrompt(
        self, request: plan_pb2.GetPlanPromptRequest, ctx: CallContext
    ) -> plan_pb2.GetPlanPromptResponse:
        return await self._read(lambda: self.engine.prompt(self.engine.load(ctx, request.plan_id)))

    @handles("plan.rollback")
    async def RollbackPlan(
        self, request: plan_pb2.RollbackPlanRequest, ctx: CallContext
    ) -> plan_pb2.RollbackPlanResponse:
        plan, outcome = await self.engine.rollback(ctx, request.plan_id, force=request.force)
        return plan_pb2.RollbackPlanResponse(
            plan=plan, restored_paths=outcome.restored, skipped_paths=outcome.skipped
        )

    @handles("plan.list")
    async def ListPlans(
        self, request: plan_pb2.ListPlansRequest, ctx: CallContext
    ) -> plan_pb2.ListPlansResponse:
        return await self._read(lambda: self.engine.list_plans(ctx, request))
