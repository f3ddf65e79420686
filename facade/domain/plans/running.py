"""``PlanRunner``: the run loop, Strategize then Execute (and Apply when automatic).

Execute runs as an asyncio task per plan, under the plan's lease; cancel sets the plan's
flag (halts.py), which the task checks at every step boundary and which interrupts a
running command. A plan that runs in another process is cancelled through its lease. A
halt (budget, failure, cancel) or an error ends the run in the state it names, recorded
with its error; a lost lease ends it without writing (the new holder settles the plan).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from ulid import ULID

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.plans import actor, approvals, halts, leases, model, setup
from cleveragents.acp.facade.domain.plans.halts import Cancels, HaltError
from cleveragents.acp.facade.domain.plans.leasing import CANCEL_REQUEST, LeaseKeeper
from cleveragents.acp.facade.domain.plans.model_run import EngineRun
from cleveragents.acp.facade.domain.plans.project_files import PlanFiles
from cleveragents.acp.facade.domain.plans.recording import STOPPED_RUNNING, PlanRecorder
from cleveragents.acp.facade.domain.plans.steps import StepRunner
from cleveragents.acp.facade.domain.tracing import traced
from cleveragents.acp.facade.store.base import LeaseLostError
from cleveragents.acp.v1 import common_pb2, plan_pb2

log = logging.getLogger(__name__)

# How long plan.cancel waits for the plan to reach its step boundary.
CANCEL_WAIT_SECONDS = 10.0


class PlanRunner:
    def __init__(
        self, recorder: PlanRecorder, keeper: LeaseKeeper, steps: StepRunner, files: PlanFiles
    ) -> None:
        self.recorder = recorder
        self.records = recorder.records
        self.keeper = keeper
        self.cancels: Cancels = steps.cancels
        self.steps = steps
        self.files = files
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    def task(self, plan_id: str) -> asyncio.Task[None] | None:
        """The task running the plan in this process, if any."""
        return self._tasks.get(plan_id)

    # plan.execute -----------------------------------------------------------------------

    async def start(
        self, plan: plan_pb2.Plan, admit: Callable[[], bool] | None = None
    ) -> asyncio.Task[None] | None:
        """Mark the plan running (a second execute sees it) and run it in a task.

        The task is registered before the store write, so a cancel or a second execute
        arriving meanwhile finds it; it starts working once the write is durable, and
        never starts when the write fails (the plan moved on since the caller read it).

        ``admit`` (an approval answered: approving.py) runs first in the same write, and
        reloads ``plan``: when it says no, its writes commit and no run starts (None)."""
        plan_id = plan.meta.id
        if self._closed:
            raise ACPError(ErrorCode.INVALID_STATE, "the server is shutting down", {"plan_id": plan_id})
        if plan_id in self._tasks:
            running = plan_pb2.Plan()
            running.CopyFrom(plan)
            running.state = model.RUNNING
            model.require("execute", running)
        loop = asyncio.get_running_loop()
        marked: asyncio.Future[None] = loop.create_future()
        self.cancels.open(plan_id)
        task = loop.create_task(self._run(plan, marked), name=f"plan-{plan_id}")
        self._tasks[plan_id] = task

        def mark_running() -> bool:
            if admit is not None and not admit():
                return False
            # The lease first: another process may be running the plan.
            self.keeper.take(plan_id)
            current = self.records.load(plan_id)
            if admit is None:
                model.require("execute", current)
            else:
                model.require_resumable(current)
            plan.ClearField("last_error")
            self.recorder.transition(plan, plan.phase, model.RUNNING)
            return True

        def drop() -> None:
            self.keeper.leases.forget(plan_id)
            task.cancel()
            self._tasks.pop(plan_id, None)
            self.cancels.forget(plan_id)

        try:
            started = await self.recorder.write(mark_running)
        except BaseException:
            drop()
            raise
        if not started:
            drop()
            return None
        self.keeper.start_heartbeat()
        marked.set_result(None)
        return task

    @traced("plan.run", lambda self, plan, marked: {"acp.plan_id": plan.meta.id})
    async def _run(self, plan: plan_pb2.Plan, marked: asyncio.Future[None]) -> None:
        await marked
        plan_id = plan.meta.id
        try:
            await self._run_leased(plan)
        except LeaseLostError as exc:
            # Another process holds the plan now and settles it: nothing more is ours to write.
            log.warning("plan %s stopped without writing: %s", plan_id, exc)
        finally:
            self._tasks.pop(plan_id, None)
            self.cancels.forget(plan_id)
            await self.keeper.release(plan_id)

    async def _run_leased(self, plan: plan_pb2.Plan) -> None:
        plan_id = plan.meta.id
        cancel = self.cancels.flag(plan_id)
        recorder = self.recorder
        try:
            plan_setup = await recorder.read(lambda: recorder.setup_of(plan))
            if plan.phase == model.STRATEGIZE:
                await self._strategize(plan, plan_setup)
                await recorder.write(lambda: recorder.transitions(plan, model.STRATEGIZE, model.EXECUTE))
            runner = recorder.model_of(plan_setup)
            if runner is not None:
                run = await EngineRun.open(recorder, self.steps, plan, plan_setup, cancel)
                try:
                    await runner.execute(run)
                finally:
                    # Text a halt or failure left held is published before the halt is written.
                    await run.flush()
            else:
                await self.steps.run_all(plan, plan_setup, cancel)
            await self.steps.validate(plan, plan_setup, cancel)
            self.cancels.check(plan_id, cancel)
            await recorder.write(lambda: recorder.transition(plan, model.EXECUTE, model.SUCCEEDED))
            if plan_setup.profile.auto_apply:
                with contextlib.suppress(ACPError):
                    await self.files.apply(plan, plan_setup)
        except approvals.PausedError as paused:
            # Stored, published and the lease freed in the pause's own write: nothing to add.
            log.info("%s", paused)
        except HaltError as halt:
            state = halt.state
            reason = self.cancels.reason(plan_id) if state == model.CANCELLED else ""
            error = halt.error if state != model.CANCELLED else None
            await recorder.write(
                lambda: recorder.transition(plan, plan.phase, state, reason=reason, error=error)
            )
        except ACPError as exc:
            failed = common_pb2.ErrorInfo(code=exc.code, message=exc.message)
            await recorder.write(lambda: recorder.transition(plan, plan.phase, model.FAILED, error=failed))
        except asyncio.CancelledError:
            await recorder.write(lambda: recorder.interrupted(plan, STOPPED_RUNNING))
            raise
        except LeaseLostError:
            raise
        except Exception:
            correlation = str(ULID())
            log.exception("plan %s failed (correlation id %s)", plan_id, correlation)
            internal = common_pb2.ErrorInfo(
                code=ErrorCode.Name(ErrorCode.INTERNAL_ERROR),
                message=f"internal error; correlation id {correlation}",
            )
            await recorder.write(lambda: recorder.transition(plan, plan.phase, model.FAILED, error=internal))

    async def _strategize(self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup) -> None:
        """The strategy is recorded even when its cost crosses the budget (then it halts).

        The prompt is built first on a worker thread: its context walks the project's
        folder, which must hold neither the loop nor the writer (every commit waits for it)."""
        inputs = actor.as_dict(plan.inputs)
        corrections = await self.recorder.read(
            lambda: [c.text for c in self.records.corrections(plan.meta.id) if c.text]
        )
        runner = self.recorder.model_of(plan_setup)
        build = actor.prompt if runner is None else runner.prompt
        given = await asyncio.to_thread(build, plan_setup, inputs, corrections)
        halt = await self.recorder.write(lambda: self._strategize_now(plan, plan_setup, inputs, given))
        if halt is not None:
            raise halt

    def _strategize_now(
        self,
        plan: plan_pb2.Plan,
        plan_setup: setup.PlanSetup,
        inputs: dict[str, Any],
        given: plan_pb2.GetPlanPromptResponse,
    ) -> HaltError | None:
        runner = self.recorder.model_of(plan_setup)
        if runner is not None:
            # A model is charged what each of its turns used, as it runs.
            self.records.save_prompt(plan.meta.id, given)
            self.recorder.record_strategy(plan, runner.strategize(plan_setup, plan))
            return None
        strategy = actor.strategize(plan_setup, plan, inputs)
        self.records.save_prompt(plan.meta.id, given)
        self.recorder.record_strategy(plan, strategy)
        try:
            halts.charge(plan, actor.usage_cost(plan_setup, given), "the actor's usage")
        except HaltError as halt:
            return halt
        self.records.save(plan)
        return None

    # plan.cancel ------------------------------------------------------------------------

    async def cancel(self, ctx: CallContext, plan_id: str, reason: str) -> plan_pb2.Plan:
        recorder = self.recorder
        plan = await recorder.read(lambda: recorder.load(ctx, plan_id))
        model.require("cancel", plan)
        task = self._tasks.get(plan_id)
        if task is None:
            held = await recorder.read(lambda: recorder.store.get_lease(leases.lease_name(plan_id)))
            if held is not None and held.live and held.owner != self.keeper.leases.owner:
                if ctx.if_revision is not None:
                    await recorder.write(lambda: self.records.touch(plan_id, fence=False))
                return await self._cancel_elsewhere(plan_id, reason or "cancelled")

            def cancel_idle() -> plan_pb2.Plan:
                # Read again in the write: the plan may have moved since (another call).
                current = self.records.load(plan_id)
                model.require("cancel", current)
                approvals.void_pending(recorder, current, "the plan was cancelled")
                recorder.transition(current, current.phase, model.CANCELLED, reason=reason or "cancelled")
                return current

            return await recorder.write(cancel_idle)
        if ctx.if_revision is not None:
            # The request itself is no save: the caller's expected revision is held here.
            await recorder.write(lambda: self.records.touch(plan_id))
        self.cancels.request(plan_id, reason or "cancelled")
        await asyncio.wait({task}, timeout=CANCEL_WAIT_SECONDS)
        return await recorder.read(lambda: self.records.load(plan_id))

    async def _cancel_elsewhere(self, plan_id: str, reason: str) -> plan_pb2.Plan:
        """The plan runs in another process: leave the cancel on its lease (its holder reads
        it at its next heartbeat or scan) and wait, as for a local plan, for it to settle."""
        name = leases.lease_name(plan_id)
        store = self.recorder.store
        if not await store.write(lambda store: store.request_lease(name, CANCEL_REQUEST + reason)):
            raise leases.busy(plan_id)
        deadline = time.monotonic() + CANCEL_WAIT_SECONDS
        while time.monotonic() < deadline:
            plan = await store.read(lambda _store: self.records.load(plan_id))
            if plan.state != model.RUNNING:
                return plan
            await asyncio.sleep(0.05)
        return await store.read(lambda _store: self.records.load(plan_id))

    async def close(self) -> None:
        """Stop running plans (they are recorded as interrupted, their leases released) and
        start no new ones."""
        self._closed = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
