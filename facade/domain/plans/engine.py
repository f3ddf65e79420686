"""``PlanEngine``: the plan lifecycle, Strategize -> Execute -> Apply, behind one object.

The engine assembles the rooms of the plan engine and answers the ``plan.*`` operations
through them (docs/architecture.md, "The plan engine"): ``PlanRecorder`` (recording.py)
saves states and publishes events off the loop, ``PlanCreator`` (creation.py) makes plans,
``PlanRunner`` (running.py) runs them with ``StepRunner`` (steps.py) and a model's turns
(model_run.py), ``PlanFiles`` (project_files.py) applies and rolls back, ``PlanCorrector``
(corrections.py) corrects, ``LeaseKeeper`` (leasing.py) keeps the leases this process holds
and ``Takeover`` (takeover.py) settles the plans of processes that stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain import paging
from cleveragents.acp.facade.domain.events.log import EventLog
from cleveragents.acp.facade.domain.models.client import ChatModels
from cleveragents.acp.facade.domain.plans import diff, leases, listing, model, records, setup
from cleveragents.acp.facade.domain.plans.apply import Restored
from cleveragents.acp.facade.domain.plans.approvals import ApprovalGate
from cleveragents.acp.facade.domain.plans.approving import Approver
from cleveragents.acp.facade.domain.plans.corrections import PlanCorrector
from cleveragents.acp.facade.domain.plans.creation import PlanCreator
from cleveragents.acp.facade.domain.plans.halts import Cancels
from cleveragents.acp.facade.domain.plans.leases import PlanLeases
from cleveragents.acp.facade.domain.plans.leasing import LeaseKeeper
from cleveragents.acp.facade.domain.plans.model_actor import ModelActor
from cleveragents.acp.facade.domain.plans.project_files import PlanFiles
from cleveragents.acp.facade.domain.plans.recording import PlanRecorder
from cleveragents.acp.facade.domain.plans.records import PlanRecords
from cleveragents.acp.facade.domain.plans.running import PlanRunner
from cleveragents.acp.facade.domain.plans.staging import StagedArtifact
from cleveragents.acp.facade.domain.plans.steps import StepRunner
from cleveragents.acp.facade.domain.plans.takeover import Takeover
from cleveragents.acp.facade.domain.registries import Registries
from cleveragents.acp.facade.store.base import Lease
from cleveragents.acp.v1 import plan_pb2


class PlanEngine:
    def __init__(
        self,
        events: EventLog,
        registries: Registries,
        models: ChatModels | None = None,
        *,
        lease_seconds: float | None = None,
        takeover: bool = False,
    ) -> None:
        """``takeover``: scan for plans whose holder stopped and settle them, as long as the
        engine is open (a server); without it (a local CLI) they are settled only at
        ``recover``, and the engine runs no task of its own once its plans are done."""
        self.store = events.store
        self.events = events
        self.registries = registries
        # Runs plans whose actor is a model (provider ``openai``); None: only scripted ones.
        self.model_actor = ModelActor(registries, models) if models is not None else None
        self.leases = PlanLeases(
            self.store, leases.ttl_from_env() if lease_seconds is None else lease_seconds
        )
        self.records = PlanRecords(self.store, self.leases.fence)
        self.pages = paging.Pager(self.store)
        self.recorder = PlanRecorder(events, registries, self.records, self.model_actor)
        cancels = Cancels()
        self.keeper = LeaseKeeper(self.store, self.leases, cancels)
        self.gate = ApprovalGate(self.recorder, self.leases)
        self.files = PlanFiles(self.recorder, self.keeper, self.gate)
        self.runner = PlanRunner(
            self.recorder, self.keeper, StepRunner(self.recorder, cancels, self.gate), self.files
        )
        self.approver = Approver(self.recorder, self.gate, self.runner, self.files, self.pages)
        self.creator = PlanCreator(self.recorder, self.runner)
        self.corrector = PlanCorrector(self.recorder, self.runner)
        self.takeover = Takeover(self.recorder, self.keeper, self.runner, self.files)
        self._closed = False
        self._scans = takeover
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop()
            self.start()

    def start(self) -> None:
        """On the loop that serves: with ``takeover``, start the scanner (once). Opened on
        a worker thread (a server migrating while it listens), the server calls this when
        the facade is attached (``ServiceFacade.start``)."""
        if self._scans and not self._closed:
            self.takeover.start_scanner()
            # Requests past their expiry get their fallback, whoever is asking.
            self.approver.start_sweeper()

    # reads -------------------------------------------------------------------------------

    def load(self, ctx: CallContext, plan_id: str) -> plan_pb2.Plan:
        """The plan, once the caller may use its namespace (else, as for an unknown id,
        PLAN_NOT_FOUND: ids tell nothing of other namespaces)."""
        return self.recorder.load(ctx, plan_id)

    def list_plans(self, ctx: CallContext, request: plan_pb2.ListPlansRequest) -> plan_pb2.ListPlansResponse:
        return listing.page(self.records, self.pages, ctx, request)

    def artifacts(self, plan: plan_pb2.Plan) -> list[StagedArtifact]:
        return self.recorder.staging(plan).artifacts()

    def diff(self, plan: plan_pb2.Plan) -> plan_pb2.GetPlanDiffResponse:
        """The diff and the digest of exactly the staged artifacts it shows (one read)."""
        artifacts = self.artifacts(plan)
        return plan_pb2.GetPlanDiffResponse(
            files=[diff.file_diff(a) for a in artifacts], digest=diff.digest(artifacts)
        )

    def prompt(self, plan: plan_pb2.Plan) -> plan_pb2.GetPlanPromptResponse:
        given = self.records.prompt(plan.meta.id)
        if given is None:
            raise ACPError(
                ErrorCode.INVALID_STATE,
                f"plan {plan.meta.id} has not been strategized; its actor was given nothing yet",
                {
                    "plan_id": plan.meta.id,
                    "operation": "plan.prompt",
                    "phase": model.phase_name(plan.phase),
                    "state": model.state_name(plan.state),
                },
            )
        return given

    # plan.use, plan.execute, plan.cancel, plan.correct ---------------------------------------

    async def use(self, ctx: CallContext, request: plan_pb2.UsePlanRequest) -> plan_pb2.Plan:
        return await self.creator.use(ctx, request)

    async def start_plan(
        self,
        ctx: CallContext,
        *,
        namespace: str,
        action: str,
        project: str,
        session_id: str,
        inputs: dict[str, Any],
    ) -> plan_pb2.Plan:
        """The sessions' ``PlanStarter``: ``/use <action> k=v`` in a session."""
        ctx.authorize(namespace)
        return await self.creator.create(
            namespace=namespace, action=action, project=project, inputs=inputs, session_id=session_id
        )

    async def execute(self, ctx: CallContext, plan_id: str, *, wait: bool = False) -> plan_pb2.Plan:
        plan = await self.recorder.read(lambda: self.load(ctx, plan_id))
        model.require("execute", plan)
        with records.expecting(plan_id, ctx.if_revision):
            task = await self.runner.start(plan)
        if wait and task is not None:
            await asyncio.shield(task)
        return await self.recorder.read(lambda: self.records.load(plan_id))

    async def cancel(self, ctx: CallContext, plan_id: str, *, reason: str = "") -> plan_pb2.Plan:
        with records.expecting(plan_id, ctx.if_revision):
            return await self.runner.cancel(ctx, plan_id, reason)

    async def correct(
        self, ctx: CallContext, request: plan_pb2.CorrectPlanRequest
    ) -> tuple[plan_pb2.Plan, plan_pb2.DecisionNode]:
        with records.expecting(request.plan_id, ctx.if_revision):
            return await self.corrector.correct(ctx, request)

    # plan.apply, plan.rollback ----------------------------------------------------------------

    async def apply(
        self, ctx: CallContext, plan_id: str, diff_digest: str = ""
    ) -> tuple[plan_pb2.Plan, list[str]]:
        def loaded() -> tuple[plan_pb2.Plan, setup.PlanSetup]:
            plan = self.load(ctx, plan_id)
            return plan, self.recorder.setup_of(plan)

        plan, plan_setup = await self.recorder.read(loaded)
        model.require("apply", plan)
        with records.expecting(plan_id, ctx.if_revision):
            changed = await self.files.apply(plan, plan_setup, diff_digest)
        return plan, changed

    async def rollback(
        self, ctx: CallContext, plan_id: str, *, force: bool = False
    ) -> tuple[plan_pb2.Plan, Restored]:
        plan, entries = await self.recorder.read(
            lambda: (self.load(ctx, plan_id), self.records.checkpoint(plan_id))
        )
        model.require("rollback", plan)
        with records.expecting(plan_id, ctx.if_revision):
            return plan, await self.files.rollback(plan, entries, force)

    # restart, takeover and shutdown -----------------------------------------------------------

    def recover(self) -> None:
        """At start, before any call (blocking): settle what stopped processes left
        (``Takeover.recover``)."""
        self.takeover.recover()

    async def take_over(self, lease: Lease) -> bool:
        """Claim a takeable lease and settle its plan as ``recover`` does (``Takeover.take_over``)."""
        return await self.takeover.take_over(lease)

    async def close(self) -> None:
        """Stop running plans (they are recorded as interrupted, their leases released) and
        refuse new ones; then stop the scanner and the heartbeat."""
        self._closed = True
        self.keeper.closing()
        await self.approver.close()
        await self.runner.close()
        await self.takeover.close()
        await self.keeper.close()
