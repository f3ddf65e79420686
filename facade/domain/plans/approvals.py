"""Approval requests (ACP 1.3): how they are stored, and the gate a step or an apply passes.

A request is a record of kind ``approval`` (the ``Approval`` proto; state and plan indexed).
``ApprovalGate`` asks the automation profile's policy (approval_policy.py) before a step runs
or an apply writes: when a person must answer, it stores the request, publishes
``approval.requested``, moves the plan to ``awaiting_approval`` and frees the plan's lease, all
in one transaction, and the run ends (``PausedError``): a waiting plan holds no lease and no task.
When the plan runs again (approving.py resumes it once answered), the gate finds the answer
bound to the same digest and lets the step run, or refuses it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from google.protobuf import timestamp_pb2
from ulid import ULID

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.access import approval_rules as policies
from cleveragents.acp.facade.domain.plans import actor, leases, model, setup, tools
from cleveragents.acp.facade.domain.plans.leases import PlanLeases
from cleveragents.acp.facade.domain.plans.recording import PlanRecorder, now
from cleveragents.acp.facade.store.base import ListQuery, Record, Store
from cleveragents.acp.v1 import approval_pb2, plan_pb2

KIND = "approval"
STEP = "step"
APPLY = "apply"
PENDING = approval_pb2.APPROVAL_STATE_PENDING
ALLOWED = approval_pb2.APPROVAL_STATE_ALLOWED
REJECTED = approval_pb2.APPROVAL_STATE_REJECTED
EXPIRED = approval_pb2.APPROVAL_STATE_EXPIRED
VOID = approval_pb2.APPROVAL_STATE_VOID
ALWAYS = frozenset({approval_pb2.APPROVAL_ANSWER_ALLOW_ALWAYS, approval_pb2.APPROVAL_ANSWER_REJECT_ALWAYS})
ALLOWING = frozenset({approval_pb2.APPROVAL_ANSWER_ALLOW_ONCE, approval_pb2.APPROVAL_ANSWER_ALLOW_ALWAYS})
# What a step refused by a person or a policy fails with.
REJECTED_CODE = "approval_rejected"
# The requests of one plan a gate reads, at most (a plan asks once per step it runs).
PLAN_LIMIT = 10_000


def new_id() -> str:
    return str(ULID())


def state_name(state: approval_pb2.ApprovalState.ValueType) -> str:
    return approval_pb2.ApprovalState.Name(state).removeprefix("APPROVAL_STATE_").lower()


def answer_name(answer: approval_pb2.ApprovalAnswer.ValueType) -> str:
    return approval_pb2.ApprovalAnswer.Name(answer).removeprefix("APPROVAL_ANSWER_").lower()


def not_found(approval_id: str) -> ACPError:
    return ACPError(
        ErrorCode.NOT_FOUND,
        f"no approval request with id {approval_id!r}",
        {"approval_id": approval_id},
        refinement="APPROVAL_NOT_FOUND",
    )


def decided(approval: approval_pb2.Approval) -> ACPError:
    """A second answer (or one to a request that expired or went void)."""
    state = state_name(approval.state)
    if approval.state == VOID:
        return ACPError(
            ErrorCode.INVALID_STATE,
            f"approval request {approval.id} is void ({approval.reason}); "
            + (f"answer {approval.replaced_by} instead" if approval.replaced_by else "nothing waits on it"),
            {"approval_id": approval.id, "state": state, "replaced_by": approval.replaced_by},
            refinement="APPROVAL_VOID",
        )
    who = approval.answered_by or "expiry"
    return ACPError(
        ErrorCode.INVALID_STATE,
        f"approval request {approval.id} was already decided: {answer_name(approval.answer)} by {who}",
        {
            "approval_id": approval.id,
            "state": state,
            "answer": answer_name(approval.answer),
            "answered_by": who,
            "decide_time": approval.decide_time.ToJsonString(),
        },
        refinement="APPROVAL_DECIDED",
    )


def stamp_in(seconds: float) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromNanoseconds(int((time.time() + seconds) * 1e9))
    return stamp


def expired_by_time(approval: approval_pb2.Approval) -> bool:
    return (
        approval.state == PENDING
        and approval.HasField("expire_time")
        and approval.expire_time.ToNanoseconds() <= time.time_ns()
    )


class ApprovalRecords:
    """Approval requests in the store (inside the caller's transaction or snapshot)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def find(self, approval_id: str) -> approval_pb2.Approval | None:
        record = self.store.get(KIND, approval_id)
        if record is None:
            return None
        return self.of(record)

    @staticmethod
    def of(record: Record) -> approval_pb2.Approval:
        approval = approval_pb2.Approval.FromString(record.body)
        approval.revision = record.revision
        return approval

    def load(self, approval_id: str) -> approval_pb2.Approval:
        found = self.find(approval_id)
        if found is None:
            raise not_found(approval_id)
        return found

    def resume_state(self, approval_id: str) -> tuple[model.Phase, model.State]:
        """The (phase, state) an apply's plan goes back to once answered."""
        record = self.store.get(KIND, approval_id)
        text = record.attrs.get("resume", "") if record is not None else ""
        phase, _, state = text.partition("/")
        return (
            plan_pb2.PlanPhase.ValueType(int(phase or model.EXECUTE)),
            plan_pb2.PlanState.ValueType(int(state or model.SUCCEEDED)),
        )

    def _record(self, approval: approval_pb2.Approval, resume: str = "") -> Record:
        return Record(
            kind=KIND,
            id=approval.id,
            namespace=approval.namespace,
            body=approval.SerializeToString(),
            revision=approval.revision,
            state=state_name(approval.state),
            attrs={
                "plan_id": approval.plan_id,
                "session_id": approval.session_id,
                "kind": approval.kind,
                **({"resume": resume} if resume else {}),
            },
            create_time=approval.create_time.ToNanoseconds() / 1e9,
            update_time=time.time(),
        )

    def insert(self, approval: approval_pb2.Approval, resume: str = "") -> None:
        approval.revision = 1
        self.store.insert(self._record(approval, resume))

    def update(self, approval: approval_pb2.Approval) -> None:
        """Compare-and-set on the revision read: of two writers, the second fails
        (StaleRevisionError), so one answer wins on every store."""
        read = approval.revision
        current = self.store.get(KIND, approval.id)
        resume = current.attrs.get("resume", "") if current is not None else ""
        approval.revision = read + 1
        self.store.update(self._record(approval, resume), expected_revision=read)

    def of_plan(self, plan_id: str) -> list[approval_pb2.Approval]:
        """The plan's requests, newest first."""
        query = ListQuery(KIND, None, attrs={"plan_id": plan_id}, limit=PLAN_LIMIT)
        return [self.of(r) for r in self.store.query(query)]


@dataclass(frozen=True)
class Gate:
    """What the gate decided: run, ``rejected`` (why), or ``paused`` on ``approval``."""

    rejected: str = ""
    approval: approval_pb2.Approval | None = None

    @property
    def paused(self) -> bool:
        return self.approval is not None


RUN = Gate()
# Read-only look: a request would have to be made (so the gate writes, checking again).
_ASK = Gate(rejected="ask")


class PausedError(Exception):
    """The plan waits for an answer: its request is stored and its lease freed."""

    def __init__(self, approval: approval_pb2.Approval) -> None:
        super().__init__(f"plan {approval.plan_id} awaits approval {approval.id}")
        self.approval = approval


def _subject(
    recorder: PlanRecorder, plan: plan_pb2.Plan, step: plan_pb2.PlanStep
) -> tuple[policies.Subject, dict[str, Any]]:
    spec = setup.tool_spec(recorder.registries, plan.meta.namespace, step.tool)
    args = actor.as_dict(step.args)
    command: tuple[str, ...] = ()
    if spec is not None:
        try:
            command = tuple(tools.command_argv(spec, args))
        except tools.StepError:
            command = tuple(spec.argv)
    subject = policies.Subject(
        step.tool, command, spec.cost if spec is not None else 0.0, is_command=spec is not None
    )
    fields = {
        "kind": STEP,
        "step_id": step.id,
        "tool": step.tool,
        "args": args,
        "command": list(command),
    }
    return subject, fields


def _standing(found: list[approval_pb2.Approval], subject: policies.Subject) -> approval_pb2.Approval | None:
    """An ``*_always`` answer of this plan whose scope covers ``subject`` (newest first)."""
    for approval in found:
        if approval.state != ALLOWED and approval.state != REJECTED:
            continue
        if approval.answer not in ALWAYS or approval.kind != STEP:
            continue
        scope = policies.scope(policies.Subject(approval.tool, tuple(approval.command)), approval.rule)
        if scope.startswith(policies.COMMAND_PATTERN):
            if policies.matches(scope, subject):
                return approval
        elif scope == subject.tool:
            return approval
    return None


def _outcome(approval: approval_pb2.Approval) -> Gate:
    if approval.answer in ALLOWING:
        return RUN
    who = approval.answered_by or "expiry"
    why = f": {approval.reason}" if approval.reason else ""
    return Gate(rejected=f"rejected by {who} (approval {approval.id}, {answer_name(approval.answer)}){why}")


class ApprovalGate:
    def __init__(self, recorder: PlanRecorder, plan_leases: PlanLeases) -> None:
        self.recorder = recorder
        self.store = recorder.store
        self.leases = plan_leases
        self.approvals = ApprovalRecords(recorder.store)

    @staticmethod
    def asks(policy: approval_pb2.ApprovalPolicy) -> bool:
        """Whether the policy can stop anything (most profiles have none: no write)."""
        return bool(policy.ask or policy.deny or policy.cost_threshold)

    # a step -------------------------------------------------------------------------------

    async def step(self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup, step: plan_pb2.PlanStep) -> Gate:
        """Run, rejected, or paused (the request stored, the plan awaiting, its lease freed)."""
        policy = plan_setup.profile.approval
        if not self.asks(policy):
            return RUN
        # A read first: a step allowed (or refused) already needs no write of its own.
        looked = await self.recorder.read(lambda: self._step_now(plan, plan_setup, step, pause=False))
        if looked is not _ASK:
            return looked
        return await self.recorder.write(lambda: self._step_now(plan, plan_setup, step))

    def step_digest(self, plan: plan_pb2.Plan, step: plan_pb2.PlanStep) -> str:
        return policies.digest(_subject(self.recorder, plan, step)[1])

    def _step_now(
        self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup, step: plan_pb2.PlanStep, *, pause: bool = True
    ) -> Gate:
        policy = plan_setup.profile.approval
        subject, fields = _subject(self.recorder, plan, step)
        verdict = policies.decide(policy, subject)
        if verdict.what == policies.RUN:
            return RUN
        if verdict.what == policies.DENY:
            return Gate(rejected=f"refused by the approval policy ({verdict.rule})")
        found = self.approvals.of_plan(plan.meta.id)
        standing = _standing(found, subject)
        if standing is not None:
            return _outcome(standing)
        digest = policies.digest(fields)
        for approval in found:
            if approval.step_id == step.id and approval.digest == digest and approval.state != VOID:
                if approval.state == PENDING:
                    return Gate(approval=approval)
                return _outcome(approval)
        if not pause:
            return _ASK
        approval = self._new(plan, plan_setup, verdict.rule, digest)
        approval.kind = STEP
        approval.step_id = step.id
        approval.tool = step.tool
        approval.args.CopyFrom(step.args)
        approval.command.extend(subject.command)
        self._pause(plan, approval)
        return Gate(approval=approval)

    # an apply -----------------------------------------------------------------------------

    async def apply(
        self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup, digest: str, diff_text: str
    ) -> Gate:
        policy = plan_setup.profile.approval
        if not self.asks(policy):
            return RUN
        return await self.recorder.write(lambda: self._apply_now(plan, plan_setup, digest, diff_text))

    def _apply_now(
        self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup, digest: str, diff_text: str
    ) -> Gate:
        verdict = policies.decide(plan_setup.profile.approval, policies.Subject(policies.APPLY))
        if verdict.what == policies.RUN:
            return RUN
        if verdict.what == policies.DENY:
            return Gate(rejected=f"refused by the approval policy ({verdict.rule})")
        for approval in self.approvals.of_plan(plan.meta.id):
            if approval.kind == APPLY and approval.digest == digest and approval.state != VOID:
                if approval.state == PENDING:
                    return Gate(approval=approval)
                return _outcome(approval)
        approval = self._new(plan, plan_setup, verdict.rule, digest)
        approval.kind = APPLY
        approval.tool = policies.APPLY
        approval.diff = diff_text
        self._pause(plan, approval)
        return Gate(approval=approval)

    # shared -------------------------------------------------------------------------------

    def _new(
        self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup, rule: str, digest: str
    ) -> approval_pb2.Approval:
        policy = plan_setup.profile.approval
        approval = approval_pb2.Approval(
            id=new_id(),
            namespace=plan.meta.namespace,
            plan_id=plan.meta.id,
            session_id=plan.session_id,
            digest=digest,
            rule=rule,
            answerable_by=policies.answerable_by(policy),
            state=PENDING,
            create_time=now(),
            fallback=policy.fallback or "reject",
        )
        if policy.expire_seconds:
            approval.expire_time.CopyFrom(stamp_in(policy.expire_seconds))
        return approval

    def _pause(self, plan: plan_pb2.Plan, approval: approval_pb2.Approval) -> None:
        """Inside a write: the request stored and published, the plan awaiting, its lease
        (if this process holds it) released when the transaction commits."""
        resume = f"{plan.phase}/{plan.state}"
        with self.store.transaction():
            self.approvals.insert(approval, resume)
            self.recorder.publish(plan, approval_requested=approval_pb2.ApprovalEvent(approval=approval))
            self.recorder.transition(
                plan, plan.phase, model.AWAITING_APPROVAL, reason=f"approval {approval.id}"
            )
            token = self.leases.held.get(plan.meta.id)
            if token is not None:
                self.store.release_lease(leases.lease_name(plan.meta.id), token)
                plan_id = plan.meta.id
                self.store.after_commit(lambda: self.leases.forget(plan_id))


def void_pending(recorder: PlanRecorder, plan: plan_pb2.Plan, reason: str) -> list[approval_pb2.Approval]:
    """Inside a write: the plan's pending requests void (``approval.decided``, state void):
    what they asked about changed (a correction, a cancel)."""
    records = ApprovalRecords(recorder.store)
    voided = []
    for approval in records.of_plan(plan.meta.id):
        if approval.state != PENDING:
            continue
        approval.state = VOID
        approval.reason = reason
        approval.decide_time.CopyFrom(now())
        records.update(approval)
        recorder.publish(plan, approval_decided=approval_pb2.ApprovalEvent(approval=approval))
        voided.append(approval)
    return voided
