"""``PlanEngine``: the plan lifecycle, Strategize -> Execute -> Apply.

Execute runs as an asyncio task per plan; cancel sets the plan's flag, which the task
checks at every step boundary and which interrupts a running command. Every state change
is saved and its events published in one store transaction, state first, so a subscriber
that sees an event reads at least that state. Budgets (cost, max steps) stop a plan with
BUDGET_EXCEEDED in its status and a ``plan.error`` event.

The event loop never waits for the store: every read an async method makes runs in
``_read`` (a store reader thread, one snapshot) and every write in ``_write`` (the store's
writer thread, committed durably, with its events, before the await returns). The sync
helpers (``_transition``, ``_record_strategy``, ``load``...) run inside those functions.

Execution is leased (leases.py): the process running a plan, or writing its project,
holds the plan's lease, and every write it makes for the plan is fenced by the lease's
token. When the holder dies, whoever takes the lease over settles the plan as a stopped
server's is settled at start (``recover``): an apply half-written is undone from its
checkpoint, and a plan left running is failed with reason ``interrupted``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any, NoReturn, TypeVar

from google.protobuf import json_format, timestamp_pb2
from ulid import ULID

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain import paging
from cleveragents.acp.facade.domain.access import roles
from cleveragents.acp.facade.domain.access.policy import HOW_TO_ALLOW_COMMANDS
from cleveragents.acp.facade.domain.beneath import Anchor
from cleveragents.acp.facade.domain.bounded import caller_work, json_schemas
from cleveragents.acp.facade.domain.events.log import EventLog
from cleveragents.acp.facade.domain.models.client import ChatModels
from cleveragents.acp.facade.domain.plans import (
    actor,
    apply,
    diff,
    invariants,
    leases,
    listing,
    model,
    model_actor,
    model_run,
    records,
    rollback,
    setup,
    tools,
    validations,
)
from cleveragents.acp.facade.domain.plans.apply import Fence, Restored, Write
from cleveragents.acp.facade.domain.plans.leases import PlanLeases
from cleveragents.acp.facade.domain.plans.model_actor import ModelActor
from cleveragents.acp.facade.domain.plans.records import CheckpointEntry, PlanRecords, not_found
from cleveragents.acp.facade.domain.plans.staging import StagedArtifact, Staging
from cleveragents.acp.facade.domain.registries import Registries
from cleveragents.acp.facade.domain.registries.specs import DEFAULT_MAX_STEPS
from cleveragents.acp.facade.domain.tracing import traced
from cleveragents.acp.facade.store.base import Lease, LeaseLostError, Record, Store, StoreBusyError
from cleveragents.acp.v1 import common_pb2, events_pb2, plan_pb2, registry_pb2, specs_pb2

log = logging.getLogger(__name__)
T = TypeVar("T")

# How long plan.cancel waits for the plan to reach its step boundary.
CANCEL_WAIT_SECONDS = 10.0
# What a plan left running by a process that stopped is failed with.
STOPPED_RUNNING = "the server stopped while the plan was running"
# How long ``recover`` waits out the locks of a process that stopped inside a transaction
# (a PostgreSQL replica frozen there keeps them at most $ACP_STORE_IDLE_TRANSACTION_SECONDS,
# 10 by default: pg_settings.py); then STORE_BUSY, as before it waited.
RECOVERY_PATIENCE = 60.0
STOPPED_APPLYING = "the server stopped during apply; every file was restored"
# A cross-process cancel, left on the plan's lease for its holder (leases.py).
CANCEL_REQUEST = "cancel:"
# Settling a plan whose holder stopped: pre-images to restore, then a transition to record.
Settlement = tuple[list[CheckpointEntry], Callable[[], None]]
SESSION_KIND = "session"


class _HaltError(Exception):
    """Stops a running plan: the state it ends in and the error it records."""

    def __init__(self, state: model.State, code: str, message: str) -> None:
        super().__init__(message)
        self.state = state
        self.error = common_pb2.ErrorInfo(code=code, message=message)


def _now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


def _inputs(schema: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """The inputs with the schema's top-level defaults filled in, or INVALID_PARAMS."""
    inputs = dict(given)
    for name, prop in (schema.get("properties") or {}).items():
        if isinstance(prop, dict) and "default" in prop and name not in inputs:
            inputs[name] = prop["default"]
    if not schema:
        return inputs
    try:
        validator_class = json_schemas.check(schema)
    except json_schemas.SchemaError as exc:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"the action's inputs_schema is not valid: {exc.message}",
            {"field": "action"},
        ) from None
    problems = json_schemas.errors(validator_class, schema, inputs)
    if problems:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"inputs do not match the action's schema: {'; '.join(problems)}",
            {"field": "inputs", "errors": problems},
        )
    return inputs


def _patiently(store: Store, work: Callable[[], T], deadline: float) -> T:
    """``work`` in a transaction of its own, blocking, tried again (backing off) while a
    lock another process holds makes it STORE_BUSY, until ``deadline`` (monotonic)."""
    delay = 0.05
    while True:
        try:
            with store.transaction():
                return work()
        except StoreBusyError as exc:
            if time.monotonic() + delay >= deadline:
                raise
            log.warning(
                "plan recovery waits for a lock another process holds (%s); again in %.2f s", exc, delay
            )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def _lease_of(name: str, store: Store) -> Lease | None:
    return store.get_lease(name)


def _index_of(steps: Sequence[plan_pb2.PlanStep], step: plan_pb2.PlanStep) -> int:
    """Where ``step`` (this very object) sits; a model's call is among the last added."""
    for index in range(len(steps) - 1, -1, -1):
        if steps[index] is step:
            return index
    raise ValueError(f"step {step.id!r} is not in the plan's steps")


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
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._cancels: dict[str, asyncio.Event] = {}
        self._cancel_reasons: dict[str, str] = {}
        self._closed = False
        # Plans whose files are being applied or rolled back on a worker thread.
        self._file_work: set[str] = set()
        # The heartbeat (while this engine holds a lease) and the takeover scanner.
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._scanner: asyncio.Task[None] | None = None
        # Plans whose resources this process could not see, already logged.
        self._unseen: set[str] = set()
        self._takeover = takeover
        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop()
            self.start()

    def start(self) -> None:
        """On the loop that serves: with ``takeover``, start the scanner (once). Opened on
        a worker thread (a server migrating while it listens), the server calls this when
        the facade is attached (``ServiceFacade.start``)."""
        if self._takeover and self._scanner is None and not self._closed:
            interval = min(1.0, self.leases.ttl / 4)
            self._scanner = asyncio.get_running_loop().create_task(
                self._every(interval, self._scan), name="plan-lease-scanner"
            )

    # the store, off the loop --------------------------------------------------------------

    async def _read(self, fn: Callable[[], T]) -> T:
        """``fn`` on a store reader thread, in one snapshot: the loop serves others meanwhile."""
        return await self.store.read(lambda _store: fn())

    async def _write(self, fn: Callable[[], T]) -> T:
        """``fn`` on the store's writer thread, in one transaction that is durable (and its
        events delivered) when this returns; if ``fn`` raises, nothing of it is written."""
        return await self.store.write(lambda _store: fn())

    # loading ----------------------------------------------------------------------------

    def load(self, ctx: CallContext, plan_id: str) -> plan_pb2.Plan:
        """The plan, once the caller may use its namespace (else, as for an unknown id,
        PLAN_NOT_FOUND: ids tell nothing of other namespaces)."""
        plan = self.records.load(plan_id)
        if not ctx.may_see(plan.meta.namespace):
            raise not_found(plan_id)
        return plan

    def list_plans(self, ctx: CallContext, request: plan_pb2.ListPlansRequest) -> plan_pb2.ListPlansResponse:
        return listing.page(self.records, self.pages, ctx, request)

    def _setup(self, plan: plan_pb2.Plan) -> setup.PlanSetup:
        return setup.resolve(
            self.registries,
            plan.meta.namespace,
            self.records.action(plan.meta.id),
            plan.project,
            plan.automation_profile,
        )

    def _model(self, plan_setup: setup.PlanSetup) -> ModelActor | None:
        """The model actor when the plan's actor is a model; None for the scripted one."""
        if not model_actor.is_model(plan_setup):
            return None
        if self.model_actor is None:
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                f"actor {plan_setup.actor.name!r} is a model; this engine runs only scripted plans",
                {"field": "action", "actor": plan_setup.actor.name},
            )
        return self.model_actor

    def _staging(self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup | None = None) -> Staging:
        """The plan's staged view; read views need only the project's resources."""
        if plan_setup is not None:
            resources = plan_setup.resources
        else:
            project = self.registries.fetch(registry_pb2.Project, plan.meta.namespace, plan.project)
            resources = setup.resources_of(self.registries, plan.meta.namespace, project)
        return Staging(resources, self.records.changes(plan.meta.id))

    # events and transitions ------------------------------------------------------------

    def _publish(self, plan: plan_pb2.Plan, **payload: Any) -> events_pb2.Event:
        """A plan's event, fenced by its lease like every other write for it."""
        with self.records.fenced(plan.meta.id):
            return self.events.publish(
                events_pb2.Event(
                    namespace=plan.meta.namespace, plan_id=plan.meta.id, session_id=plan.session_id, **payload
                )
            )

    def _transition(
        self,
        plan: plan_pb2.Plan,
        phase: model.Phase,
        state: model.State,
        *,
        reason: str = "",
        error: common_pb2.ErrorInfo | None = None,
        journal: str | None = None,
        before: Sequence[dict[str, Any]] = (),
    ) -> None:
        """Save the new (phase, state) and publish, in one transaction: ``before`` events,
        then ``plan.error``, ``plan.phase_changed`` and ``plan.state_changed``."""
        old_phase, old_state = plan.phase, plan.state
        now = _now()
        plan.phase, plan.state = phase, state
        timing = next((t for t in plan.timings if t.phase == phase), None)
        if timing is None:
            timing = plan.timings.add(phase=phase)
        if state == model.RUNNING:
            timing.start_time.CopyFrom(now)
            timing.ClearField("end_time")
        elif state in model.TERMINAL:
            if not timing.HasField("start_time"):
                timing.start_time.CopyFrom(now)
            timing.end_time.CopyFrom(now)
        if error is not None:
            plan.last_error.CopyFrom(error)
        with self.store.transaction():
            self.records.save(plan, journal=journal)
            for payload in before:
                self._publish(plan, **payload)
            if error is not None:
                self._publish(plan, plan_error=events_pb2.PlanError(error=error))
            if phase != old_phase:
                self._publish(
                    plan, plan_phase_changed=events_pb2.PlanPhaseChanged(from_phase=old_phase, to_phase=phase)
                )
            self._publish(
                plan,
                plan_state_changed=events_pb2.PlanStateChanged(
                    phase=phase, from_state=old_state, to_state=state, reason=reason
                ),
            )

    def _record_error(self, plan: plan_pb2.Plan, error: common_pb2.ErrorInfo) -> None:
        """An error that leaves the plan's state as it is (a refused apply)."""
        plan.last_error.CopyFrom(error)
        with self.store.transaction():
            self.records.save(plan)
            self._publish(plan, plan_error=events_pb2.PlanError(error=error))

    @staticmethod
    def _progress(plan: plan_pb2.Plan, steps: Sequence[plan_pb2.PlanStep]) -> None:
        current = [s for s in steps if not model.superseded(s)]
        plan.progress.total = len(current)
        plan.progress.done = sum(1 for s in current if s.state == model.SUCCEEDED)

    @staticmethod
    def _budget_left(plan: plan_pb2.Plan) -> float | None:
        return plan.cost.budget - plan.cost.spent if plan.cost.budget else None

    @staticmethod
    def _fail(code: str, message: str) -> NoReturn:
        raise _HaltError(model.FAILED, code, message)

    def _charge(self, plan: plan_pb2.Plan, amount: float, what: str) -> None:
        """Add spent cost; crossing the budget halts the plan."""
        plan.cost.spent += amount
        if plan.cost.budget and plan.cost.spent > plan.cost.budget:
            raise _HaltError(
                model.FAILED,
                ErrorCode.Name(ErrorCode.BUDGET_EXCEEDED),
                f"{what} brought the cost to {plan.cost.spent:g}, over the budget of {plan.cost.budget:g}",
            )

    # plan.use ---------------------------------------------------------------------------

    async def use(self, ctx: CallContext, request: plan_pb2.UsePlanRequest) -> plan_pb2.Plan:
        namespace = ctx.namespace(request.namespace)
        if request.automation_profile:
            await self._read(
                lambda: self._check_profile_override(
                    ctx, namespace, request.action, request.automation_profile
                )
            )
        return await self._use(
            namespace=namespace,
            action=request.action,
            project=request.project,
            inputs=json_format.MessageToDict(request.inputs),
            session_id=request.session_id,
            automation_profile=request.automation_profile,
        )

    def _check_profile_override(self, ctx: CallContext, namespace: str, action: str, profile: str) -> None:
        """A profile named on plan.use allows no command the action's own profile does not,
        unless an admin asks (roles.check_profile_override)."""
        action_entry = self.registries.fetch(registry_pb2.Action, namespace, action)
        chosen = self.registries.fetch(registry_pb2.AutomationProfile, namespace, profile).spec
        own = None
        if action_entry.spec.automation_profile:
            own = self.registries.fetch(
                registry_pb2.AutomationProfile, namespace, action_entry.spec.automation_profile
            ).spec
        roles.check_profile_override(ctx, chosen, own, profile)

    async def _use(
        self,
        *,
        namespace: str,
        action: str,
        project: str,
        inputs: dict[str, Any],
        session_id: str = "",
        automation_profile: str = "",
    ) -> plan_pb2.Plan:
        def resolve() -> tuple[registry_pb2.Action, str, setup.PlanSetup]:
            action_entry = self.registries.fetch(registry_pb2.Action, namespace, action)
            profile_name = automation_profile or action_entry.spec.automation_profile
            plan_setup = setup.resolve(self.registries, namespace, action_entry, project, profile_name)
            setup.check_egress(self.registries, plan_setup.actor)
            if session_id:
                session = self.store.get(SESSION_KIND, session_id)
                if session is None or session.namespace != namespace:
                    raise ACPError(
                        ErrorCode.NOT_FOUND,
                        f"no session {session_id!r} in namespace {namespace!r}",
                        {"session_id": session_id},
                        refinement="SESSION_NOT_FOUND",
                    )
            return action_entry, profile_name, plan_setup

        action_entry, profile_name, plan_setup = await self._read(resolve)
        # On the caller-work pool: bounded, shared fairly between namespaces, and stopped if
        # the caller leaves (RE2 matches without the GIL: a long input holds no other call).
        schema = actor.as_dict(action_entry.spec.inputs_schema)
        values = await caller_work.CALLER_WORK.run(namespace, _inputs, schema, inputs)
        steps = actor.declared_steps(action_entry.spec, values)
        await self._read(lambda: [setup.tool_spec(self.registries, namespace, step.tool) for step in steps])
        # A model chooses its own steps: the declared ones are the scripted actor's.
        planned = 0 if self._model(plan_setup) is not None else len(steps)
        # The template only: the prompt's context lists the project's files, a walk of the
        # folder that must not run on the loop (it is built when the plan strategizes).
        actor.task(plan_setup, values)
        now = _now()
        plan = plan_pb2.Plan(
            meta=common_pb2.EntityMeta(id=str(ULID()), namespace=namespace, create_time=now, update_time=now),
            action=action,
            project=project,
            session_id=session_id,
            inputs=actor.struct(values),
            phase=model.STRATEGIZE,
            state=model.PENDING,
            progress=plan_pb2.Progress(done=0, total=planned),
            cost=plan_pb2.Cost(spent=0, budget=plan_setup.profile.cost_budget),
            automation_profile=profile_name,
        )

        def create() -> None:
            self.records.insert(plan)
            self.records.save_action(plan.meta.id, action_entry)
            self._publish(plan, plan_created=events_pb2.PlanCreated(action=action, project=project))

        await self._write(create)
        if plan_setup.profile.auto_execute:
            await self._start(plan)
        return plan

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
        return await self._use(
            namespace=namespace, action=action, project=project, inputs=inputs, session_id=session_id
        )

    # plan.execute -----------------------------------------------------------------------

    async def execute(self, ctx: CallContext, plan_id: str, *, wait: bool = False) -> plan_pb2.Plan:
        plan = await self._read(lambda: self.load(ctx, plan_id))
        model.require("execute", plan)
        task = await self._start(plan)
        if wait:
            await asyncio.shield(task)
        return await self._read(lambda: self.records.load(plan_id))

    async def _start(self, plan: plan_pb2.Plan) -> asyncio.Task[None]:
        """Mark the plan running (a second execute sees it) and run it in a task.

        The task is registered before the store write, so a cancel or a second execute
        arriving meanwhile finds it; it starts working once the write is durable, and
        never starts when the write fails (the plan moved on since the caller read it)."""
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
        self._cancels[plan_id] = asyncio.Event()
        task = loop.create_task(self._run(plan, marked), name=f"plan-{plan_id}")
        self._tasks[plan_id] = task

        def mark_running() -> None:
            # The lease first: another process may be running the plan.
            self._take_lease(plan_id)
            model.require("execute", self.records.load(plan_id))
            plan.ClearField("last_error")
            self._transition(plan, plan.phase, model.RUNNING)

        try:
            await self._write(mark_running)
        except BaseException:
            self.leases.forget(plan_id)
            task.cancel()
            self._tasks.pop(plan_id, None)
            self._cancels.pop(plan_id, None)
            raise
        self._start_heartbeat()
        marked.set_result(None)
        return task

    def _take_lease(self, plan_id: str) -> None:
        """In a write: claim the plan's lease (PLAN_LEASED if another process holds it)."""
        if not self.leases.claim(plan_id):
            raise leases.busy(plan_id)

    async def _release(self, plan_id: str) -> None:
        if self.leases.holds(plan_id):
            await self._write(lambda: self.leases.release(plan_id))
        self._stop_heartbeat_if_idle()

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
            self._cancels.pop(plan_id, None)
            self._cancel_reasons.pop(plan_id, None)
            await self._release(plan_id)

    async def _run_leased(self, plan: plan_pb2.Plan) -> None:
        plan_id = plan.meta.id
        cancel = self._cancels[plan_id]
        try:
            plan_setup = await self._read(lambda: self._setup(plan))
            if plan.phase == model.STRATEGIZE:
                await self._strategize(plan, plan_setup)
                await self._write(lambda: self._transitions(plan, model.STRATEGIZE, model.EXECUTE))
            runner = self._model(plan_setup)
            if runner is not None:
                run = await model_run.EngineRun.open(self, plan, plan_setup, cancel)
                try:
                    await runner.execute(run)
                finally:
                    # Text a halt or failure left held is published before the halt is written.
                    await run.flush()
            else:
                await self._steps(plan, plan_setup, cancel)
            await self._validate(plan, plan_setup, cancel)
            self._check_cancel(plan_id, cancel)
            await self._write(lambda: self._transition(plan, model.EXECUTE, model.SUCCEEDED))
            if plan_setup.profile.auto_apply:
                with contextlib.suppress(ACPError):
                    await self._apply(plan, plan_setup)
        except _HaltError as halt:
            state = halt.state
            reason = self._cancel_reasons.get(plan_id, "") if state == model.CANCELLED else ""
            error = halt.error if state != model.CANCELLED else None
            await self._write(lambda: self._transition(plan, plan.phase, state, reason=reason, error=error))
        except ACPError as exc:
            failed = common_pb2.ErrorInfo(code=exc.code, message=exc.message)
            await self._write(lambda: self._transition(plan, plan.phase, model.FAILED, error=failed))
        except asyncio.CancelledError:
            await self._write(lambda: self._interrupted(plan, STOPPED_RUNNING))
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
            await self._write(lambda: self._transition(plan, plan.phase, model.FAILED, error=internal))

    def _check_cancel(self, plan_id: str, cancel: asyncio.Event) -> None:
        if cancel.is_set():
            raise _HaltError(model.CANCELLED, "cancelled", self._cancel_reasons.get(plan_id) or "cancelled")

    def _transitions(self, plan: plan_pb2.Plan, done: model.Phase, next_phase: model.Phase) -> None:
        """``done`` succeeded and ``next_phase`` runs, in one transaction."""
        self._transition(plan, done, model.SUCCEEDED)
        self._transition(plan, next_phase, model.RUNNING)

    async def _strategize(self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup) -> None:
        """The strategy is recorded even when its cost crosses the budget (then it halts).

        The prompt is built first on a worker thread: its context walks the project's
        folder, which must hold neither the loop nor the writer (every commit waits for it)."""
        inputs = actor.as_dict(plan.inputs)
        corrections = await self._read(
            lambda: [c.text for c in self.records.corrections(plan.meta.id) if c.text]
        )
        runner = self._model(plan_setup)
        build = actor.prompt if runner is None else runner.prompt
        given = await asyncio.to_thread(build, plan_setup, inputs, corrections)
        halt = await self._write(lambda: self._strategize_now(plan, plan_setup, inputs, given))
        if halt is not None:
            raise halt

    def _strategize_now(
        self,
        plan: plan_pb2.Plan,
        plan_setup: setup.PlanSetup,
        inputs: dict[str, Any],
        given: plan_pb2.GetPlanPromptResponse,
    ) -> _HaltError | None:
        runner = self._model(plan_setup)
        if runner is not None:
            # A model is charged what each of its turns used, as it runs.
            self.records.save_prompt(plan.meta.id, given)
            self._record_strategy(plan, runner.strategize(plan_setup, plan))
            return None
        strategy = actor.strategize(plan_setup, plan, inputs)
        self.records.save_prompt(plan.meta.id, given)
        self._record_strategy(plan, strategy)
        try:
            self._charge(plan, actor.usage_cost(plan_setup, given), "the actor's usage")
        except _HaltError as halt:
            return halt
        self.records.save(plan)
        return None

    def _record_strategy(self, plan: plan_pb2.Plan, strategy: actor.Strategy) -> None:
        """Publish a decision per new node (each remembers its event's sequence), then save."""
        with self.store.transaction():
            for node in strategy.new_nodes:
                event = self._publish(plan, plan_decision_made=events_pb2.PlanDecisionMade(node=node))
                node.event_sequence = event.sequence
            self.records.save_nodes(plan.meta.id, strategy.nodes)
            self.records.save_steps(plan.meta.id, strategy.steps)
            self._progress(plan, strategy.steps)
            self.records.save(plan)

    def _record_turn(
        self,
        plan: plan_pb2.Plan,
        nodes: Sequence[plan_pb2.DecisionNode],
        steps: Sequence[plan_pb2.PlanStep],
        stored: tuple[int, int],
    ) -> None:
        """A model turn's decisions: ``nodes`` and ``steps`` grew past the ``stored`` counts
        (nodes, steps) by appending, so only the new rows are written and their events
        published: a turn costs the same however long the plan ran."""
        stored_nodes, stored_steps = stored
        with self.store.transaction():
            for node in nodes[stored_nodes:]:
                event = self._publish(plan, plan_decision_made=events_pb2.PlanDecisionMade(node=node))
                node.event_sequence = event.sequence
            self.records.put_nodes(plan.meta.id, dict(enumerate(nodes[stored_nodes:], stored_nodes)))
            added = steps[stored_steps:]
            self.records.put_steps(plan.meta.id, dict(enumerate(added, stored_steps)))
            # New steps are pending: progress grows by those that count, as _progress counts.
            plan.progress.total += sum(1 for s in added if not model.superseded(s))
            self.records.save(plan)

    async def _steps(self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup, cancel: asyncio.Event) -> None:
        steps, staging = await self._read(
            lambda: (self.records.steps(plan.meta.id), self._staging(plan, plan_setup))
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
            self._check_cancel(plan.meta.id, cancel)
            if position > limit:
                set_by = "the automation profile allows" if plan_setup.profile.max_steps else "the default is"
                raise _HaltError(
                    model.FAILED,
                    ErrorCode.Name(ErrorCode.BUDGET_EXCEEDED),
                    f"step {step.id!r} would be step {position}; {set_by} {limit}",
                )
            await self._step(plan, plan_setup, staging, steps, step, cancel, index=index)

    @traced(
        "plan.tool_call", lambda self, plan, setup, staging, steps, step, *_, **__: {"acp.tool": step.tool}
    )
    async def _step(
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
            raise _HaltError(
                model.FAILED,
                "tool_not_allowed",
                f"step {step.id!r}: tool {step.tool!r} is not allowed by the automation profile "
                f"{plan_setup.profile_name or '(none)'}",
            )
        spec = await self._write(lambda: self._begin_step(plan, index, step))
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
            await self._write(lambda: self._end_step(plan, index, step, completed, []))
            if cancelled:
                self._check_cancel(plan.meta.id, cancel)
            if not halt:
                return completed
            raise _HaltError(
                model.FAILED, model.STEP_FAILED, f"step {step.id!r} ({step.tool}) failed: {failure.message}"
            )
        step.state = model.SUCCEEDED
        completed.ok = True
        completed.result.CopyFrom(actor.struct(outcome.result))
        for change in outcome.changes:
            staging.record(change)
        # The step was running, so it was not counted done: progress moves by one.
        plan.progress.done += 1
        await self._write(lambda: self._end_step(plan, index, step, completed, outcome.changes))
        return completed

    def _begin_step(
        self, plan: plan_pb2.Plan, index: int, step: plan_pb2.PlanStep
    ) -> specs_pb2.ToolSpec | None:
        """The step's tool (None: built in), once it may run; the step saved running and
        ``tool.invoked`` published. A refusal halts the plan and writes nothing."""
        spec = setup.tool_spec(self.registries, plan.meta.namespace, step.tool)
        if spec is not None and not self.registries.policy.allow_commands:
            raise _HaltError(
                model.FAILED,
                "commands_disabled",
                f"step {step.id!r}: tool {step.tool!r} runs a command; this server runs no commands "
                f"({HOW_TO_ALLOW_COMMANDS})",
            )
        price = spec.cost if spec is not None else 0.0
        left = self._budget_left(plan)
        if left is not None and price > left:
            raise _HaltError(
                model.FAILED,
                ErrorCode.Name(ErrorCode.BUDGET_EXCEEDED),
                f"step {step.id!r} costs {price:g}; only {max(left, 0):g} of the budget "
                f"{plan.cost.budget:g} is left",
            )
        step.state = model.RUNNING
        with self.store.transaction():
            self.records.save_step(plan.meta.id, index, step)
            self._publish(
                plan, tool_invoked=events_pb2.ToolInvoked(step_id=step.id, tool=step.tool, args=step.args)
            )
        return spec

    def _end_step(
        self,
        plan: plan_pb2.Plan,
        index: int,
        step: plan_pb2.PlanStep,
        completed: events_pb2.ToolCompleted,
        changes: Sequence[records.Change],
    ) -> None:
        """The step's outcome, its staged changes and the plan, with ``tool.completed``."""
        with self.store.transaction():
            self.records.add_changes(plan.meta.id, changes)
            self.records.save_step(plan.meta.id, index, step)
            self.records.save(plan)
            self._publish(plan, tool_completed=completed)

    async def _validate(
        self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup, cancel: asyncio.Event
    ) -> None:
        checks, staging = await self._read(
            lambda: (
                setup.validations(self.registries, plan.meta.namespace, plan_setup.action),
                self._staging(plan, plan_setup),
            )
        )
        # The project's files are read on a worker thread, as apply reads them.
        artifacts = await asyncio.to_thread(staging.artifacts)
        results: list[events_pb2.ValidationCompleted] = []
        for name, spec in checks:
            self._check_cancel(plan.meta.id, cancel)
            result = validations.refused(
                name, spec, self.registries.policy, plan_setup.profile
            ) or await validations.run(
                plan.meta.namespace, name, spec, staging, artifacts, cancel, self.registries.policy
            )
            results.append(result)
            await self._write(lambda: self._record_validation(plan, results))
        failed = [r for r in results if not r.passed]
        if failed:
            self._check_cancel(plan.meta.id, cancel)
            messages = [f"{r.validation}: {m}" for r in failed for m in r.messages]
            raise _HaltError(
                model.FAILED, model.VALIDATION_FAILED, "validation failed: " + "; ".join(messages)
            )

    def _record_validation(self, plan: plan_pb2.Plan, results: list[events_pb2.ValidationCompleted]) -> None:
        """The results so far, with ``validation.completed`` for the newest."""
        with self.store.transaction():
            self.records.save_validations(plan.meta.id, results)
            self._publish(plan, validation_completed=results[-1])

    # plan.cancel ------------------------------------------------------------------------

    async def cancel(self, ctx: CallContext, plan_id: str, *, reason: str = "") -> plan_pb2.Plan:
        plan = await self._read(lambda: self.load(ctx, plan_id))
        model.require("cancel", plan)
        task = self._tasks.get(plan_id)
        if task is None:
            held = await self._read(lambda: self.store.get_lease(leases.lease_name(plan_id)))
            if held is not None and held.live and held.owner != self.leases.owner:
                return await self._cancel_elsewhere(plan_id, reason or "cancelled")

            def cancel_idle() -> plan_pb2.Plan:
                # Read again in the write: the plan may have moved since (another call).
                current = self.records.load(plan_id)
                model.require("cancel", current)
                self._transition(current, current.phase, model.CANCELLED, reason=reason or "cancelled")
                return current

            return await self._write(cancel_idle)
        self._cancel_reasons[plan_id] = reason or "cancelled"
        self._cancels[plan_id].set()
        await asyncio.wait({task}, timeout=CANCEL_WAIT_SECONDS)
        return await self._read(lambda: self.records.load(plan_id))

    async def _cancel_elsewhere(self, plan_id: str, reason: str) -> plan_pb2.Plan:
        """The plan runs in another process: leave the cancel on its lease (its holder reads
        it at its next heartbeat or scan) and wait, as for a local plan, for it to settle."""
        name = leases.lease_name(plan_id)
        if not await self.store.write(lambda store: store.request_lease(name, CANCEL_REQUEST + reason)):
            raise leases.busy(plan_id)
        deadline = time.monotonic() + CANCEL_WAIT_SECONDS
        while time.monotonic() < deadline:
            plan = await self.store.read(lambda _store: self.records.load(plan_id))
            if plan.state != model.RUNNING:
                return plan
            await asyncio.sleep(0.05)
        return await self.store.read(lambda _store: self.records.load(plan_id))

    # plan.correct -----------------------------------------------------------------------

    async def correct(
        self, ctx: CallContext, request: plan_pb2.CorrectPlanRequest
    ) -> tuple[plan_pb2.Plan, plan_pb2.DecisionNode]:
        plan, nodes, plan_setup, corrections, steps = await self._read(
            lambda: self._correction_of(ctx, request)
        )
        runner = self._model(plan_setup)
        if runner is not None:
            return await model_run.correct(self, plan, plan_setup, runner, nodes, corrections, request)
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

        await self._read(check_overrides)
        texts = [c.text for c in [*corrections, request] if c.text]
        # Off the loop: the prompt's context walks the project's folder.
        given = await asyncio.to_thread(actor.prompt, plan_setup, actor.as_dict(plan.inputs), texts)
        plan.ClearField("last_error")

        def record() -> None:
            self._still(plan, "correct")
            self.records.add_correction(plan.meta.id, request)
            kept = [c for c in self.records.changes(plan.meta.id) if c.step_id not in strategy.discarded]
            self.records.save_changes(plan.meta.id, kept)
            self.records.save_prompt(plan.meta.id, given)
            self._transition(plan, model.STRATEGIZE, model.RUNNING, reason="correction")
            self._record_strategy(plan, strategy)

        await self._write(record)
        try:
            self._charge(plan, actor.usage_cost(plan_setup, given), "the actor's usage")
        except _HaltError as halt:
            error = halt.error
            await self._write(lambda: self._transition(plan, model.STRATEGIZE, model.FAILED, error=error))
            return plan, await self._read(lambda: self._node(plan.meta.id, node.id))

        def settle() -> None:
            self._transition(plan, model.STRATEGIZE, model.SUCCEEDED, reason="correction")
            self._transition(plan, model.EXECUTE, model.PENDING, reason="correction")

        await self._write(settle)
        if plan_setup.profile.auto_execute:
            await self._start(plan)
        return await self._read(lambda: (self.records.load(plan.meta.id), self._node(plan.meta.id, node.id)))

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
        plan = self.load(ctx, request.plan_id)
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
            self._setup(plan),
            self.records.corrections(plan.meta.id),
            self.records.steps(plan.meta.id),
        )

    def _still(self, plan: plan_pb2.Plan, operation: str) -> None:
        """Inside a write: INVALID_STATE when the stored plan moved on since ``plan`` was
        read (another call changed it while this one awaited) so ``operation`` may no longer run."""
        current = self.records.load(plan.meta.id)
        if (current.phase, current.state) != (plan.phase, plan.state):
            model.require(operation, current)
            raise ACPError(
                ErrorCode.INVALID_STATE,
                f"plan {plan.meta.id} changed while plan.{operation} ran; call it again",
                {"plan_id": plan.meta.id, "operation": f"plan.{operation}"},
            )

    def _node(self, plan_id: str, node_id: str) -> plan_pb2.DecisionNode:
        return next(n for n in self.records.nodes(plan_id) if n.id == node_id)

    # plan.apply -------------------------------------------------------------------------

    async def apply(self, ctx: CallContext, plan_id: str) -> tuple[plan_pb2.Plan, list[str]]:
        plan, plan_setup = await self._read(lambda: self._loaded_setup(ctx, plan_id))
        model.require("apply", plan)
        changed = await self._apply(plan, plan_setup)
        return plan, changed

    def _loaded_setup(self, ctx: CallContext, plan_id: str) -> tuple[plan_pb2.Plan, setup.PlanSetup]:
        plan = self.load(ctx, plan_id)
        return plan, self._setup(plan)

    async def _prepare_apply(self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup) -> list[Write]:
        """Invariants first (every violation listed), then the writes and their checkpoint.

        Reading the staged files and matching the invariants (a forbid_regex over every
        file's content) runs on a worker thread: a big plan's check holds no other call."""
        staging, checks = await self._read(
            lambda: (
                self._staging(plan, plan_setup),
                setup.invariants(self.registries, plan.meta.namespace, plan_setup.action),
            )
        )
        artifacts, found = await asyncio.to_thread(invariants.check, checks, staging.artifacts)
        if found:
            message = f"apply refused: {len(found)} invariant violation(s): " + "; ".join(found)
            raise ACPError(ErrorCode.INVALID_STATE, message, {"plan_id": plan.meta.id, "violations": found})
        return await asyncio.to_thread(apply.prepare, artifacts, plan_setup.resources)

    async def _apply(self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup) -> list[str]:
        """Refusals leave the plan's state as it was and record the error. The file work
        (reads, fsyncs) runs on a worker thread, one apply or rollback per plan, shielded:
        a caller that goes away does not leave the plan half-applied."""
        return await asyncio.shield(self._apply_exclusive(plan, plan_setup))

    async def _apply_exclusive(self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup) -> list[str]:
        with self._exclusive(plan.meta.id):
            return await self._apply_files(plan, plan_setup)

    @contextlib.contextmanager
    def _exclusive(self, plan_id: str) -> Iterator[None]:
        """One file operation (apply, rollback) per plan at a time: they run off the loop."""
        if plan_id in self._file_work:
            raise ACPError(
                ErrorCode.INVALID_STATE,
                f"plan {plan_id} is being applied or rolled back",
                {"plan_id": plan_id},
            )
        self._file_work.add(plan_id)
        try:
            yield
        finally:
            self._file_work.discard(plan_id)

    async def _apply_files(self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup) -> list[str]:
        try:
            writes = await self._prepare_apply(plan, plan_setup)
        except ACPError as exc:
            refused = common_pb2.ErrorInfo(code=exc.code, message=exc.message)
            await self._write(lambda: self._record_error(plan, refused))
            raise
        entries = [w.entry for w in writes]

        def begin() -> None:
            self._still(plan, "apply")
            self.records.save_checkpoint(plan.meta.id, entries)
            plan.ClearField("last_error")
            self._transition(plan, model.APPLY, model.RUNNING, journal=records.JOURNAL_APPLYING)

        try:
            async with self._leased_file_work(plan.meta.id, begin):
                return await self._write_files(plan, writes, entries)
        except LeaseLostError as exc:
            # Taken over mid-apply: the new holder restores the checkpoint; nothing is ours.
            log.warning("plan %s: apply stopped: %s", plan.meta.id, exc)
            raise leases.lost(plan.meta.id, exc) from None

    @contextlib.asynccontextmanager
    async def _leased_file_work(self, plan_id: str, begin: Callable[[], None]) -> AsyncIterator[None]:
        """The plan's lease around an apply's or rollback's file work: claimed in the write
        that runs ``begin`` (forgotten if that write fails), renewed by the heartbeat while
        the files change, released after. A run's auto-apply already holds the run's lease,
        which stays the run's to release."""
        claimed = not self.leases.holds(plan_id)

        def leased() -> None:
            if claimed:
                self._take_lease(plan_id)
            begin()

        try:
            await self._write(leased)
        except BaseException:
            if claimed:
                self.leases.forget(plan_id)
            raise
        self._start_heartbeat()
        try:
            yield
        finally:
            if claimed:
                await self._release(plan_id)

    async def _write_files(
        self, plan: plan_pb2.Plan, writes: list[Write], entries: list[CheckpointEntry]
    ) -> list[str]:
        try:
            await asyncio.to_thread(apply.write_all, writes, self._file_fence(plan.meta.id))
        except OSError as exc:
            undone = await asyncio.to_thread(apply.restore_all, entries, apply.anchors_of(writes))
            raise await self._apply_failed(plan, exc, undone) from None
        changed = [e.path for e in entries]
        completed = events_pb2.PlanApplyCompleted(changed_paths=changed, checkpoint_id=plan.meta.id)
        await self._write(
            lambda: self._transition(
                plan,
                model.APPLY,
                model.SUCCEEDED,
                journal=records.JOURNAL_APPLIED,
                before=[{"plan_apply_completed": completed}],
            )
        )
        return changed

    def _file_fence(self, plan_id: str) -> Fence:
        """For the worker thread writing the files: LeaseLostError once this engine no
        longer holds the plan's lease (asked of the store, through the loop)."""
        loop = asyncio.get_running_loop()

        def fence() -> None:
            check = self.store.read(lambda store: self.leases.check(store, plan_id))
            asyncio.run_coroutine_threadsafe(check, loop).result()

        return fence

    async def _apply_failed(self, plan: plan_pb2.Plan, exc: OSError, undone: Restored) -> ACPError:
        """Record the failed apply (undone) on the plan and return the error to raise: a
        folder swapped for a symlink under the plan is the caller's INVALID_STATE
        (``PATH_CROSSES_SYMLINK``), any other I/O failure the server's INTERNAL_ERROR."""
        code, refinement = ErrorCode.INTERNAL_ERROR, None
        details: dict[str, object] = {"plan_id": plan.meta.id}
        message = f"apply failed and was undone: {exc}"
        if isinstance(exc, apply.CrossedLinkError):
            code, refinement = ErrorCode.INVALID_STATE, "PATH_CROSSES_SYMLINK"
            details["path"] = exc.path
            message = (
                f"apply stopped at {exc.path!r}: a folder on the way is now a symlink or a file "
                "(never followed); every file written was undone"
            )
        if undone.skipped:
            details["skipped_paths"] = undone.skipped
            message += f", except {', '.join(undone.skipped)} (a folder on the way is now a symlink)"
        failed = common_pb2.ErrorInfo(code=ErrorCode.Name(code), message=message)
        await self._write(
            lambda: self._transition(
                plan, model.APPLY, model.FAILED, error=failed, journal=records.JOURNAL_ABORTED
            )
        )
        return ACPError(code, message, details, refinement=refinement)

    # plan.rollback ----------------------------------------------------------------------

    async def rollback(
        self, ctx: CallContext, plan_id: str, *, force: bool = False
    ) -> tuple[plan_pb2.Plan, Restored]:
        plan, entries = await self._read(lambda: (self.load(ctx, plan_id), self.records.checkpoint(plan_id)))
        model.require("rollback", plan)
        return plan, await asyncio.shield(self._rollback_files(plan, entries, force))

    async def _rollback_files(
        self, plan: plan_pb2.Plan, entries: list[CheckpointEntry], force: bool
    ) -> Restored:
        """Off the loop and shielded, like apply."""
        with self._exclusive(plan.meta.id):
            anchors = await asyncio.to_thread(self._anchors, plan.meta.namespace, entries, refuse=True)
            await asyncio.to_thread(rollback.check, plan.meta.id, entries, anchors, force=force)

            def begin() -> None:
                self._still(plan, "rollback")
                self.records.save(plan, journal=records.JOURNAL_ROLLING_BACK)

            async with self._leased_file_work(plan.meta.id, begin):
                restored = await asyncio.to_thread(apply.restore_all, entries, anchors)
                # Paths never followed through a symlink are not restored: the plan says so.
                skipped = (
                    common_pb2.ErrorInfo(
                        code=ErrorCode.Name(ErrorCode.INVALID_STATE),
                        message=f"rolled back except {', '.join(restored.skipped)}: a folder on the "
                        "way is now a symlink or a file (never followed); those are left as they are",
                    )
                    if restored.skipped
                    else None
                )
                await self._write(
                    lambda: self._transition(
                        plan,
                        model.APPLY,
                        model.ROLLED_BACK,
                        reason="rollback",
                        error=skipped,
                        journal=records.JOURNAL_ROLLED_BACK,
                    )
                )
        return restored

    def _anchors(
        self, namespace: str, entries: Sequence[CheckpointEntry], *, refuse: bool = False
    ) -> dict[str, Anchor | None]:
        """Blocking: where each checkpoint folder is opened from, checked against the
        operator's resource roots as they are now (None: outside them, never touched). With
        ``refuse``, INVALID_STATE naming the first such folder instead."""
        found: dict[str, Anchor | None] = {}
        for entry in entries:
            if entry.root in found:
                continue
            anchor = self.registries.policy.anchor(namespace, entry.root)
            if anchor is None and refuse:
                raise ACPError(
                    ErrorCode.INVALID_STATE,
                    f"resource folder {entry.root} lies outside the server's resource roots for "
                    f"namespace {namespace!r} now; nothing was done",
                    {"path": entry.root, "resource": entry.resource},
                )
            found[entry.root] = anchor
        return found

    # read views -------------------------------------------------------------------------

    def artifacts(self, plan: plan_pb2.Plan) -> list[StagedArtifact]:
        return self._staging(plan).artifacts()

    def diff(self, plan: plan_pb2.Plan) -> list[plan_pb2.FileDiff]:
        return [diff.file_diff(a) for a in self.artifacts(plan)]

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

    # restart and shutdown ---------------------------------------------------------------

    def _interrupted(self, plan: plan_pb2.Plan, message: str) -> None:
        """The running steps failed ``interrupted`` (only their rows written), then the plan."""
        interrupted: dict[int, plan_pb2.PlanStep] = {}
        for index, step in enumerate(self.records.steps(plan.meta.id)):
            if step.state == model.RUNNING:
                step.state = model.FAILED
                step.error.CopyFrom(common_pb2.ErrorInfo(code=model.INTERRUPTED, message=message))
                interrupted[index] = step
        with self.store.transaction():
            self.records.put_steps(plan.meta.id, interrupted)
            self._transition(
                plan,
                plan.phase,
                model.FAILED,
                reason=model.INTERRUPTED,
                error=common_pb2.ErrorInfo(code=model.INTERRUPTED, message=message),
            )

    # takeover -----------------------------------------------------------------------------

    def recover(self) -> None:
        """At start, before any call (blocking): settle what stopped processes left, the
        plans in flight whose lease is free, expired, or held by a process that is gone.
        A live holder's plans are its own business; the scanner takes them if it dies. A
        lock a stalled process holds (STORE_BUSY) is waited out, up to RECOVERY_PATIENCE."""
        deadline = time.monotonic() + RECOVERY_PATIENCE
        candidates = {r.id for r in self.records.in_flight()}
        candidates.update(leases.plan_of(lease.name) for lease in self.leases.takeable(self.store))
        for plan_id in sorted(candidates):
            lease = self.store.get_lease(leases.lease_name(plan_id))
            if lease is not None and lease.live and leases.steal_token(lease) is None:
                continue
            record = self.store.get(records.KIND, plan_id)
            if record is not None and self._unseen_folder(record) is not None:
                continue

            def claim(plan_id: str = plan_id, lease: Lease | None = lease) -> tuple[bool, Record | None]:
                if not self.leases.claim(plan_id, steal_token=leases.steal_token(lease)):
                    return False, None
                return True, self.store.get(records.KIND, plan_id)

            try:
                claimed, record = _patiently(self.store, claim, deadline)
            except BaseException:
                self.leases.forget(plan_id)
                raise
            if not claimed:
                continue
            try:
                entries, finish = self._settlement(record)
                if entries and record is not None:
                    _log_skipped(
                        plan_id, apply.restore_all(entries, self._anchors(record.namespace, entries))
                    )
                _patiently(self.store, finish, deadline)
            finally:
                _patiently(self.store, functools.partial(self.leases.release, plan_id), deadline)

    def _settlement(self, record: Record | None) -> Settlement:
        """What settling a plan whose holder stopped takes: the pre-images to restore first
        (off the loop), then the transition to record (in a transaction)."""
        if record is None or not records.unsettled(record):
            return [], lambda: None
        plan = plan_pb2.Plan.FromString(record.body)
        journal = record.attrs.get("journal", "")
        if journal == records.JOURNAL_APPLYING:

            def aborted() -> None:
                self._transition(
                    plan,
                    model.APPLY,
                    model.FAILED,
                    reason=model.INTERRUPTED,
                    error=common_pb2.ErrorInfo(code=model.INTERRUPTED, message=STOPPED_APPLYING),
                    journal=records.JOURNAL_ABORTED,
                )

            return self.records.checkpoint(plan.meta.id), aborted
        if journal == records.JOURNAL_ROLLING_BACK:

            def rolled_back() -> None:
                self._transition(
                    plan,
                    model.APPLY,
                    model.ROLLED_BACK,
                    reason="rollback",
                    journal=records.JOURNAL_ROLLED_BACK,
                )

            return self.records.checkpoint(plan.meta.id), rolled_back
        return [], lambda: self._interrupted(plan, STOPPED_RUNNING)

    def _unseen_folder(self, record: Record) -> str | None:
        """Blocking (it stats folders): a folder of the plan's that this process cannot see,
        so it must not take the plan over (a restore would silently skip it). Every process
        on one database must see each resource at the same path (docs/plans.md)."""
        if not records.unsettled(record):
            return None
        if record.attrs.get("journal") in (records.JOURNAL_APPLYING, records.JOURNAL_ROLLING_BACK):
            folders = [entry.root for entry in self.records.checkpoint(record.id)]
        else:
            plan = plan_pb2.Plan.FromString(record.body)
            try:
                project = self.registries.fetch(registry_pb2.Project, plan.meta.namespace, plan.project)
                roots = setup.resources_of(self.registries, plan.meta.namespace, project)
            except ACPError:
                return None
            folders = [str(root.root) for root in roots.values()]
        for folder in folders:
            if not os.path.isdir(folder):
                if record.id not in self._unseen:
                    self._unseen.add(record.id)
                    log.error(
                        "plan %s: not taking it over: its resource folder %s is not visible to this "
                        "process (every server process on one database must see each resource at "
                        "the same path); another process that sees it will",
                        record.id,
                        folder,
                    )
                return folder
        self._unseen.discard(record.id)
        return None

    def _start_heartbeat(self) -> None:
        """Renew this engine's leases every third of the lease while it holds any. A store
        error is logged and tried again: a lease is lost only when it expires."""
        if (self._heartbeat_task is None or self._heartbeat_task.done()) and not self._closed:
            self._heartbeat_task = asyncio.get_running_loop().create_task(
                self._every(self.leases.ttl / 3, self._heartbeat, first_wait=True),
                name="plan-lease-heartbeat",
            )

    def _stop_heartbeat_if_idle(self) -> None:
        if not self.leases.held and self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            self._heartbeat_task = None

    async def _every(
        self, interval: float, work: Callable[[], Awaitable[None]], *, first_wait: bool = False
    ) -> None:
        """``work`` every ``interval``; a store outage is one line when it starts (and one
        when it ends), not a traceback each time."""
        if first_wait:
            await asyncio.sleep(interval)
        down = False
        while True:
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                outage = self.store.outage(exc)
                if outage is not None:
                    if not down:
                        log.warning(
                            "plan leases: %s cannot reach the store (%s); retrying every %g s",
                            work.__name__,
                            outage,
                            interval,
                        )
                elif isinstance(exc, StoreBusyError):
                    # Another process's lock (one frozen inside a transaction, until the store
                    # ends it): expected while it lasts, not a fault of this process.
                    log.warning("plan leases: %s waits for a lock (%s); trying again", work.__name__, exc)
                else:
                    log.exception("plan leases: %s failed; trying again", work.__name__)
                down = outage is not None
            else:
                if down:
                    log.warning("plan leases: %s reaches the store again", work.__name__)
                down = False
            await asyncio.sleep(interval)

    async def _heartbeat(self) -> None:
        if not self.leases.held:
            return
        lost, requests = await self.store.write(self.leases.renew)
        for plan_id in lost:
            name, token = leases.lease_name(plan_id), self.leases.held.get(plan_id, 0)
            current = await self.store.read(functools.partial(_lease_of, name))
            log.warning("plan %s stops here: %s", plan_id, LeaseLostError(name, token, current))
            self._stop_local(plan_id, "the plan's lease was lost")
        for plan_id, request in requests.items():
            self._requested(plan_id, request)

    def _requested(self, plan_id: str, request: str) -> None:
        if request.startswith(CANCEL_REQUEST):
            self._stop_local(plan_id, request[len(CANCEL_REQUEST) :] or "cancelled")

    def _stop_local(self, plan_id: str, reason: str) -> None:
        cancel = self._cancels.get(plan_id)
        if cancel is not None and not cancel.is_set():
            self._cancel_reasons[plan_id] = reason
            cancel.set()

    async def _scan(self) -> None:
        found = await self.store.read(lambda store: store.held_leases(leases.PREFIX, leases.SCAN_LIMIT))
        for lease in found:
            if lease.owner == self.leases.owner and lease.request:
                self._requested(leases.plan_of(lease.name), lease.request)
        for lease in self.leases.takeable(found):
            await self.take_over(lease)

    async def take_over(self, lease: Lease) -> bool:
        """Claim a takeable lease and settle its plan as ``recover`` does; False when this
        process cannot see the plan's folders or another process claimed it first."""
        plan_id = leases.plan_of(lease.name)
        if plan_id in self._tasks or plan_id in self._file_work or self.leases.holds(plan_id):
            return False
        record = await self.store.read_get(records.KIND, plan_id)
        if record is not None and await asyncio.to_thread(self._unseen_folder, record) is not None:
            return False
        steal = leases.steal_token(lease)

        def claim(store: Store) -> Settlement | None:
            if not self.leases.claim(plan_id, steal_token=steal):
                return None
            return self._settlement(store.get(records.KIND, plan_id))

        try:
            settlement = await self.store.write(claim)
        except BaseException:
            self.leases.forget(plan_id)
            raise
        if settlement is None:
            return False
        self._start_heartbeat()
        entries, finish = settlement
        self._file_work.add(plan_id)
        try:
            if entries and record is not None:
                anchors = await asyncio.to_thread(self._anchors, record.namespace, entries)
                _log_skipped(plan_id, await asyncio.to_thread(apply.restore_all, entries, anchors))
            await self.store.write(lambda _store: finish())
            log.warning("plan %s: taken over from a stopped process (lease token %d)", plan_id, lease.token)
        finally:
            self._file_work.discard(plan_id)
            await self.store.write(lambda _store: self.leases.release(plan_id))
            self._stop_heartbeat_if_idle()
        return True

    async def close(self) -> None:
        """Stop running plans (they are recorded as interrupted, their leases released) and
        refuse new ones; then stop the heartbeat and the scanner."""
        self._closed = True
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for background in (self._scanner, self._heartbeat_task):
            if background is not None:
                background.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await background
        self.leases.close()


def _log_skipped(plan_id: str, outcome: Restored) -> None:
    """Settling a stopped apply restores what it can reach: a path whose folder is now
    outside the operator's roots, or behind a symlink, is left alone and said here."""
    if outcome.skipped:
        log.error(
            "plan %s: not restored (a folder on the way is a symlink or a file, or lies outside "
            "the resource roots now; never followed): %s",
            plan_id,
            ", ".join(outcome.skipped),
        )
