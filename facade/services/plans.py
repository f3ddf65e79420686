"""plan.*: the plan lifecycle over ``PlanEngine``; namespaces checked on every call."""

from __future__ import annotations

from google.protobuf import json_format

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain import paging
from cleveragents.acp.facade.domain.plans import model
from cleveragents.acp.facade.domain.plans.engine import PlanEngine
from cleveragents.acp.facade.domain.plans.records import KIND
from cleveragents.acp.facade.store.base import ListQuery
from cleveragents.acp.v1 import plan_pb2, plan_pb2_grpc


def _explain(plan: plan_pb2.Plan, nodes: list[plan_pb2.DecisionNode]) -> str:
    """The tree as indented text, children under parents, superseded branches marked."""
    lines = [f"Plan {plan.meta.id}: action {plan.action!r} on project {plan.project!r}"]
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
            walk(node.id, depth + 1)

    walk("", 0)
    return "\n".join(lines) + "\n"


class PlanFacade(plan_pb2_grpc.PlanServiceServicer):
    def __init__(self, engine: PlanEngine) -> None:
        self.engine = engine
        self.pages = paging.PageTokens(engine.store)

    def _plan(self, plan_id: str, context: object) -> plan_pb2.Plan:
        return self.engine.load(plan_id, CallContext.of(context).authorize)

    async def UsePlan(self, request: plan_pb2.UsePlanRequest, context: object) -> plan_pb2.UsePlanResponse:
        ctx = CallContext.of(context)
        plan = await self.engine.use(
            namespace=ctx.namespace(request.namespace),
            action=request.action,
            project=request.project,
            inputs=json_format.MessageToDict(request.inputs),
            session_id=request.session_id,
            automation_profile=request.automation_profile,
        )
        return plan_pb2.UsePlanResponse(plan=plan)

    async def ExecutePlan(
        self, request: plan_pb2.ExecutePlanRequest, context: object
    ) -> plan_pb2.ExecutePlanResponse:
        authorize = CallContext.of(context).authorize
        plan = await self.engine.execute(request.plan_id, authorize, wait=request.wait)
        return plan_pb2.ExecutePlanResponse(plan=plan)

    async def ApplyPlan(
        self, request: plan_pb2.ApplyPlanRequest, context: object
    ) -> plan_pb2.ApplyPlanResponse:
        plan, changed = await self.engine.apply(request.plan_id, CallContext.of(context).authorize)
        return plan_pb2.ApplyPlanResponse(plan=plan, changed_paths=changed)

    async def CancelPlan(
        self, request: plan_pb2.CancelPlanRequest, context: object
    ) -> plan_pb2.CancelPlanResponse:
        authorize = CallContext.of(context).authorize
        plan = await self.engine.cancel(request.plan_id, authorize, reason=request.reason)
        return plan_pb2.CancelPlanResponse(plan=plan)

    async def GetPlanStatus(
        self, request: plan_pb2.GetPlanStatusRequest, context: object
    ) -> plan_pb2.GetPlanStatusResponse:
        return plan_pb2.GetPlanStatusResponse(plan=self._plan(request.plan_id, context))

    async def GetPlanTree(
        self, request: plan_pb2.GetPlanTreeRequest, context: object
    ) -> plan_pb2.GetPlanTreeResponse:
        plan = self._plan(request.plan_id, context)
        records = self.engine.records
        return plan_pb2.GetPlanTreeResponse(
            nodes=records.nodes(plan.meta.id), steps=records.steps(plan.meta.id)
        )

    async def ExplainPlan(
        self, request: plan_pb2.ExplainPlanRequest, context: object
    ) -> plan_pb2.ExplainPlanResponse:
        plan = self._plan(request.plan_id, context)
        nodes = self.engine.records.nodes(plan.meta.id)
        return plan_pb2.ExplainPlanResponse(text=_explain(plan, nodes), decisions=nodes)

    async def CorrectPlan(
        self, request: plan_pb2.CorrectPlanRequest, context: object
    ) -> plan_pb2.CorrectPlanResponse:
        plan, node = await self.engine.correct(request, CallContext.of(context).authorize)
        return plan_pb2.CorrectPlanResponse(plan=plan, node=node)

    async def GetPlanDiff(
        self, request: plan_pb2.GetPlanDiffRequest, context: object
    ) -> plan_pb2.GetPlanDiffResponse:
        return plan_pb2.GetPlanDiffResponse(files=self.engine.diff(self._plan(request.plan_id, context)))

    async def ListPlanArtifacts(
        self, request: plan_pb2.ListPlanArtifactsRequest, context: object
    ) -> plan_pb2.ListPlanArtifactsResponse:
        artifacts = self.engine.artifacts(self._plan(request.plan_id, context))
        return plan_pb2.ListPlanArtifactsResponse(
            artifacts=[a.to_proto(include_content=request.include_content) for a in artifacts]
        )

    async def GetPlanPrompt(
        self, request: plan_pb2.GetPlanPromptRequest, context: object
    ) -> plan_pb2.GetPlanPromptResponse:
        return self.engine.prompt(self._plan(request.plan_id, context))

    async def RollbackPlan(
        self, request: plan_pb2.RollbackPlanRequest, context: object
    ) -> plan_pb2.RollbackPlanResponse:
        authorize = CallContext.of(context).authorize
        plan, restored = await self.engine.rollback(request.plan_id, authorize, force=request.force)
        return plan_pb2.RollbackPlanResponse(plan=plan, restored_paths=restored)

    async def ListPlans(
        self, request: plan_pb2.ListPlansRequest, context: object
    ) -> plan_pb2.ListPlansResponse:
        ctx = CallContext.of(context)
        namespaces = ctx.visible_namespaces(request.namespace)
        size = paging.page_size(request.page_size)
        if request.state not in plan_pb2.PlanState.values():
            raise ACPError(
                ErrorCode.INVALID_PARAMS, f"unknown plan state {request.state}", {"field": "state"}
            )
        state = model.state_name(request.state) if request.state else ""
        attrs = {
            key: value
            for key, value in (("project", request.project), ("session_id", request.session_id))
            if value
        }
        filters = {
            "namespaces": sorted(namespaces) if namespaces is not None else None,
            "state": state,
            **attrs,
        }
        before = self.pages.decode(request.page_token, "plan.list", filters)
        found = self.engine.records.query(
            ListQuery(
                KIND,
                namespaces=namespaces,
                state=state or None,
                attrs=attrs,
                before_id=before,
                limit=size + 1,
            )
        )
        token = self.pages.encode("plan.list", filters, found[size - 1].meta.id) if len(found) > size else ""
        return plan_pb2.ListPlansResponse(plans=found[:size], next_page_token=token)
