"""approval.*: handlers over the plan engine's ``Approver``, which authorizes each request
by its namespace (and an answer by the roles the request names)."""

from __future__ import annotations

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.facade.domain.plans.engine import PlanEngine
from cleveragents.acp.facade.handlers.table import handles
from cleveragents.acp.v1 import approval_pb2


class ApprovalHandlers:
    def __init__(self, engine: PlanEngine) -> None:
        self.approver = engine.approver

    @handles("approval.list")
    async def ListApprovals(
        self, request: approval_pb2.ListApprovalsRequest, ctx: CallContext
    ) -> approval_pb2.ListApprovalsResponse:
        return await self.approver.list_approvals(ctx, request)

    @handles("approval.show")
    async def GetApproval(
        self, request: approval_pb2.GetApprovalRequest, ctx: CallContext
    ) -> approval_pb2.GetApprovalResponse:
        return approval_pb2.GetApprovalResponse(approval=await self.approver.show(ctx, request.approval_id))

    @handles("approval.answer")
    async def AnswerApproval(
        self, request: approval_pb2.AnswerApprovalRequest, ctx: CallContext
    ) -> approval_pb2.AnswerApprovalResponse:
        return approval_pb2.AnswerApprovalResponse(approval=await self.approver.answer(ctx, request))
