"""``Approver``: ``approval.list``, ``approval.show`` and ``approval.answer``, and expiry.

The first answer wins: the request is updated compare-and-set on its revision, in the same
write that claims the plan's lease and marks it running again (a step), or puts it back where
it was (an apply, which then runs as plan.apply would). A second answer, in this process or
any other, finds the request decided: INVALID_STATE ``APPROVAL_DECIDED`` naming who answered.
An answer whose request no longer describes what would run (another staged diff) voids it
and asks again (``APPROVAL_VOID`` names the new request). An expired request gets its
fallback (reject unless the policy says allow), once, with ``approval.expired``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

from cleveragents.acp.contract.call import CallContext, Role
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain import paging
from cleveragents.acp.facade.domain.access import roles
from cleveragents.acp.facade.domain.plans import approvals, diff, model
from cleveragents.acp.facade.domain.plans.approvals import ApprovalGate, ApprovalRecords
from cleveragents.acp.facade.domain.plans.project_files import PlanFiles
from cleveragents.acp.facade.domain.plans.recording import PlanRecorder, now
from cleveragents.acp.facade.domain.plans.running import PlanRunner
from cleveragents.acp.facade.store.base import ListQuery, StaleRevisionError
from cleveragents.acp.v1 import approval_pb2, common_pb2, plan_pb2

log = logging.getLogger(__name__)

SCOPE = "approval.list"
MAX_REASON_CHARS = 2_000
# How often a server looks for requests past their expiry.
SWEEP_SECONDS = 1.0
SWEEP_LIMIT = 100
_EXPIRY = "expiry"


class Approver:
    def __init__(
        self,
        recorder: PlanRecorder,
        gate: ApprovalGate,
        runner: PlanRunner,
        files: PlanFiles,
        pager: paging.Pager,
    ) -> None:
        self.recorder = recorder
        self.store = recorder.store
        self.gate = gate
        self.records = ApprovalRecords(recorder.store)
        self.runner = runner
        self.files = files
        self.pager = pager
        # One answer at a time in this process (the next finds the request decided at once).
        self._lock = asyncio.Lock()
        self._applies: set[asyncio.Task[list[str]]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    # reads ------------------------------------------------------------------------------------

    def _visible(self, ctx: CallContext, approval_id: str) -> approval_pb2.Approval:
        approval = self.records.find(approval_id)
        if approval is None or not ctx.may_see(approval.namespace):
            raise approvals.not_found(approval_id)
        return approval

    async def show(self, ctx: CallContext, approval_id: str) -> approval_pb2.Approval:
        approval = await self.recorder.read(lambda: self._visible(ctx, approval_id))
        if approvals.expired_by_time(approval):
            await self.expire(approval)
            approval = await self.recorder.read(lambda: self.records.load(approval_id))
        return approval

    async def list_approvals(
        self, ctx: CallContext, request: approval_pb2.ListApprovalsRequest
    ) -> approval_pb2.ListApprovalsResponse:
        namespaces = ctx.visible_namespaces(request.namespace)
        if request.state not in approval_pb2.ApprovalState.values():
            raise ACPError(
                ErrorCode.INVALID_PARAMS, f"unknown approval state {request.state}", {"field": "state"}
            )
        state = approvals.state_name(request.state) if request.state else ""
        attrs = {k: v for k, v in (("plan_id", request.plan_id), ("session_id", request.session_id)) if v}
        filters = {
            "namespaces": sorted(namespaces) if namespaces is not None else None,
            "state": state,
            **attrs,
        }

        async def fetch(after: str | None, limit: int) -> list[approval_pb2.Approval]:
            query = ListQuery(
                approvals.KIND, namespaces, state=state or None, attrs=attrs, before_id=after, limit=limit
            )
            return [self.records.of(r) for r in await self.store.read_query(query)]

        found, token = await self.pager.page_async(SCOPE, filters, request, fetch, lambda a: a.id)
        for approval in found:
            if approvals.expired_by_time(approval):
                await self.expire(approval)
                approval.CopyFrom(await self.recorder.read(functools.partial(self.records.load, approval.id)))
        return approval_pb2.ListApprovalsResponse(approvals=found, next_page_token=token)

    # approval.answer --------------------------------------------------------------------------

    def _check_request(self, request: approval_pb2.AnswerApprovalRequest) -> None:
        if request.answer not in approval_pb2.ApprovalAnswer.values() or not request.answer:
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                "answer must be allow_once, allow_always, reject_once or reject_always",
                {"field": "answer"},
            )
        if len(request.reason) > MAX_REASON_CHARS:
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                f"reason is at most {MAX_REASON_CHARS} characters",
                {"field": "reason"},
            )
        if request.digest and not diff.valid_digest(request.digest):
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                "digest is the digest approval.show answers (sha256:<64 hex digits)",
                {"field": "digest"},
            )

    async def answer(
        self, ctx: CallContext, request: approval_pb2.AnswerApprovalRequest
    ) -> approval_pb2.Approval:
        self._check_request(request)
        approval = await self.recorder.read(lambda: self._visible(ctx, request.approval_id))
        principal = ctx.require_principal()
        if principal.role not in {Role(r) for r in approval.answerable_by}:
            raise roles.forbidden(
                principal,
                Role(approval.answerable_by[0]),
                "answering this approval request",
                approval_id=approval.id,
            )
        if approval.state != approvals.PENDING:
            raise approvals.decided(approval)
        if approvals.expired_by_time(approval):
            await self.expire(approval)
            raise approvals.decided(await self.recorder.read(lambda: self.records.load(approval.id)))
        if request.digest and request.digest != approval.digest:
            raise ACPError(
                ErrorCode.INVALID_STATE,
                f"approval request {approval.id} asks about digest {approval.digest}, not {request.digest}",
                {"approval_id": approval.id, "expected": request.digest, "actual": approval.digest},
                refinement="APPROVAL_VOID",
            )
        async with self._lock:
            return await self._decide(
                approval, request.answer, principal.name, request.reason, approvals.ALLOWED
            )

    async def expire(self, approval: approval_pb2.Approval) -> None:
        """The fallback of a request past its expiry, once (a lost race is no error)."""
        fallback = (
            approval_pb2.APPROVAL_ANSWER_ALLOW_ONCE
            if approval.fallback == "allow"
            else approval_pb2.APPROVAL_ANSWER_REJECT_ONCE
        )
        with contextlib.suppress(ACPError):
            async with self._lock:
                await self._decide(approval, fallback, _EXPIRY, "expired unanswered", approvals.EXPIRED)

    async def _decide(
        self,
        approval: approval_pb2.Approval,
        answer: approval_pb2.ApprovalAnswer.ValueType,
        who: str,
        reason: str,
        state: approval_pb2.ApprovalState.ValueType,
    ) -> approval_pb2.Approval:
        approval_id = approval.id
        plan_id = approval.plan_id
        current, plan = await self.recorder.read(
            lambda: (self.records.load(approval_id), self.recorder.records.load(plan_id))
        )
        if current.state != approvals.PENDING:
            raise approvals.decided(current)
        # The run that paused may still be ending in this process: it holds nothing, but
        # the runner knows one task per plan.
        task = self.runner.task(plan_id)
        if task is not None:
            await asyncio.wait({task})
        if state != approvals.EXPIRED:
            state = approvals.ALLOWED if answer in approvals.ALLOWING else approvals.REJECTED
        decided: list[approval_pb2.Approval] = []
        replaced: list[approval_pb2.Approval] = []

        def record(current: approval_pb2.Approval, stored_plan: plan_pb2.Plan) -> None:
            current.state = state
            current.answer = answer
            current.answered_by = who
            current.reason = reason
            current.decide_time.CopyFrom(now())
            self.records.update(current)
            event = (
                {"approval_expired": approval_pb2.ApprovalEvent(approval=current)}
                if state == approvals.EXPIRED
                else {"approval_decided": approval_pb2.ApprovalEvent(approval=current)}
            )
            self.recorder.publish(stored_plan, **event)
            decided.append(current)

        def fresh() -> tuple[approval_pb2.Approval, plan_pb2.Plan]:
            current = self.records.load(approval_id)
            if current.state != approvals.PENDING:
                raise approvals.decided(current)
            return current, self.recorder.records.load(plan_id)

        try:
            if approval.kind == approvals.STEP:

                def admit() -> bool:
                    current, stored_plan = fresh()
                    plan.CopyFrom(stored_plan)
                    if not self._step_current(current, stored_plan):
                        self._void(current, stored_plan, "the step it asked about changed", replaced)
                        return False
                    record(current, stored_plan)
                    return stored_plan.state == model.AWAITING_APPROVAL

                await self.runner.start(plan, admit)
            else:
                digest_now = await self._apply_digest(plan_id)

                def settle() -> None:
                    current, stored_plan = fresh()
                    plan.CopyFrom(stored_plan)
                    if digest_now is not None and digest_now[0] != current.digest:
                        self._void(
                            current, stored_plan, "the staged diff changed", replaced, ask_again=digest_now
                        )
                        return
                    record(current, stored_plan)
                    if stored_plan.state == model.AWAITING_APPROVAL:
                        phase, back = self.records.resume_state(current.id)
                        self.recorder.transition(
                            plan, phase, back, reason=f"approval {current.id} {approvals.state_name(state)}"
                        )
                        if answer not in approvals.ALLOWING:
                            message = f"apply refused: {approvals.answer_name(answer)} by {who}"
                            self.recorder.record_error(
                                plan, common_pb2.ErrorInfo(code=approvals.REJECTED_CODE, message=message)
                            )

                await self.recorder.write(settle)
                if decided and answer in approvals.ALLOWING:
                    self._apply_later(plan, decided[0].digest)
        except StaleRevisionError:
            # Another process answered between this one's read and write.
            raise approvals.decided(
                await self.recorder.read(lambda: self.records.load(approval_id))
            ) from None
        if replaced:
            void = await self.recorder.read(lambda: self.records.load(approval_id))
            raise approvals.decided(void)
        return decided[0]

    def _step_current(self, approval: approval_pb2.Approval, plan: plan_pb2.Plan) -> bool:
        """The step the request asked about is still the one that would run, as it was."""
        for step in self.recorder.records.steps(plan.meta.id):
            if step.id == approval.step_id:
                return not model.superseded(step) and self.gate.step_digest(plan, step) == approval.digest
        return False

    async def _apply_digest(self, plan_id: str) -> tuple[str, str] | None:
        """The digest of what an apply would write now, and its diff (None: it cannot be read)."""
        try:
            plan = await self.recorder.read(lambda: self.recorder.records.load(plan_id))
            staging = await self.recorder.read(lambda: self.recorder.staging(plan))
            artifacts = await asyncio.to_thread(staging.artifacts)
        except ACPError:
            return None
        return diff.digest(artifacts), "".join(diff.file_diff(a).unified_diff for a in artifacts)

    def _void(
        self,
        approval: approval_pb2.Approval,
        plan: plan_pb2.Plan,
        why: str,
        replaced: list[approval_pb2.Approval],
        *,
        ask_again: tuple[str, str] | None = None,
    ) -> None:
        """Inside a write: the request is void; for an apply whose diff changed, a new one
        asks about the diff as it is now (the plan keeps waiting)."""
        approval.state = approvals.VOID
        approval.reason = why
        approval.decide_time.CopyFrom(now())
        if ask_again:
            again = approval_pb2.Approval()
            again.CopyFrom(approval)
            again.id = approvals.new_id()
            again.digest, again.diff = ask_again
            again.state = approvals.PENDING
            again.reason = ""
            again.ClearField("decide_time")
            again.create_time.CopyFrom(now())
            approval.replaced_by = again.id
            self.records.insert(again, "/".join(map(str, self.records.resume_state(approval.id))))
            self.recorder.publish(plan, approval_requested=approval_pb2.ApprovalEvent(approval=again))
        self.records.update(approval)
        self.recorder.publish(plan, approval_decided=approval_pb2.ApprovalEvent(approval=approval))
        replaced.append(approval)

    def _apply_later(self, plan: plan_pb2.Plan, digest: str) -> None:
        """An allowed apply runs now, as plan.apply bound to the digest it was allowed for."""

        async def apply_now() -> list[str]:
            plan_setup = await self.recorder.read(lambda: self.recorder.setup_of(plan))
            return await self.files.apply(plan, plan_setup, digest)

        task = asyncio.get_running_loop().create_task(apply_now(), name=f"approved-apply-{plan.meta.id}")
        self._applies.add(task)
        task.add_done_callback(self._applied)

    def _applied(self, task: asyncio.Task[list[str]]) -> None:
        self._applies.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("an approved apply did not complete: %s", task.exception())

    # expiry -------------------------------------------------------------------------------------

    def start_sweeper(self) -> None:
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(
                self._sweep_forever(), name="approval-expiry"
            )

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                await self.sweep()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("approval expiry: a sweep failed; trying again")

    async def sweep(self) -> int:
        """Expire the pending requests past their expiry; how many this process expired."""
        query = ListQuery(
            approvals.KIND, None, state=approvals.state_name(approvals.PENDING), limit=SWEEP_LIMIT
        )
        records = await self.store.read_query(query)
        due = [a for a in map(self.records.of, records) if approvals.expired_by_time(a)]
        for approval in due:
            await self.expire(approval)
        return len(due)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        if self._applies:
            await asyncio.gather(*self._applies, return_exceptions=True)
