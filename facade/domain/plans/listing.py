"""plan.list: the plans a caller may see, newest first, filtered by state, project and session."""

from __future__ import annotations

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.paging import Pager
from cleveragents.acp.facade.domain.plans import model
from cleveragents.acp.facade.domain.plans.records import KIND, PlanRecords
from cleveragents.acp.facade.store.base import ListQuery
from cleveragents.acp.v1 import plan_pb2

SCOPE = "plan.list"


def page(
    records: PlanRecords, pager: Pager, ctx: CallContext, request: plan_pb2.ListPlansRequest
) -> plan_pb2.ListPlansResponse:
    namespaces = ctx.visible_namespaces(request.namespace)
    if request.state not in plan_pb2.PlanState.values():
        raise ACPError(ErrorCode.INVALID_PARAMS, f"unknown plan state {request.state}", {"field": "state"})
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

    def fetch(after: str | None, limit: int) -> list[plan_pb2.Plan]:
        query = ListQuery(KIND, namespaces, state=state or None, attrs=attrs, before_id=after, limit=limit)
        return records.query(query)

    plans, token = pager.page(SCOPE, filters, request, fetch, lambda plan: plan.meta.id)
    return plan_pb2.ListPlansResponse(plans=plans, next_page_token=token)
