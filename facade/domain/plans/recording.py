"""``PlanRecorder``: a plan's records and events, and what it runs with, off the event loop.

Every state change is saved and its events published in one store transaction, state
first, so a subscriber that sees an event reads at least that state. The event loop never
waits for the store: every read an async method makes runs in ``read`` (a store reader
thread, one snapshot) and every write in ``write`` (the store's writer thread, committed
durably, with its events, before the await returns). The sync methods (``transition``,
``record_strategy``, ``load``...) run inside those functions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from google.protobuf import timestamp_pb2

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.events.log import EventLog
from cleveragents.acp.facade.domain.plans import actor, model, model_actor, setup
from cleveragents.acp.facade.domain.plans.model_actor import ModelActor
from cleveragents.acp.facade.domain.plans.records import PlanRecords, not_found
from cleveragents.acp.facade.domain.plans.staging import Staging
from cleveragents.acp.facade.domain.registries import Registries
from cleveragents.acp.v1 import common_pb2, events_pb2, plan_pb2, registry_pb2

T = TypeVar("T")

# What a plan left running by a process that stopped is failed with.
STOPPED_RUNNING = "the server stopped while the plan was running"


def now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


def progress(plan: plan_pb2.Plan, steps: Sequence[plan_pb2.PlanStep]) -> None:
    current = [s for s in steps if not model.superseded(s)]
    plan.progress.total = len(current)
    plan.progress.done = sum(1 for s in current if s.state == model.SUCCEEDED)


class PlanRecorder:
    def __init__(
        self,
        events: EventLog,
        registries: Registries,
        records: PlanRecords,
        models: ModelActor | None,
    ) -> None:
        """``models``: runs plans whose actor is a model; None: only scripted ones."""
        self.store = events.store
        self.events = events
        self.registries = registries
        self.records = records
        self.model_actor = models

    # the store, off the loop --------------------------------------------------------------

    async def read(self, fn: Callable[[], T]) -> T:
        """``fn`` on a store reader thread, in one snapshot: the loop serves others meanwhile."""
        return await self.store.read(lambda _store: fn())

    async def write(self, fn: Callable[[], T]) -> T:
        """``fn`` on the store's writer thread, in one transaction that is durable (and its
        events delivered) when this returns; if ``fn`` raises, nothing of it is written."""
        return await self.store.write(lambda _store: fn())

    # what a plan runs with ------------------------------------------------------------------

    def load(self, ctx: CallContext, plan_id: str) -> plan_pb2.Plan:
        """The plan, once the caller may use its namespace (else, as for an unknown id,
        PLAN_NOT_FOUND: ids tell nothing of other namespaces)."""
        plan = self.records.load(plan_id)
        if not ctx.may_see(plan.meta.namespace):
            raise not_found(plan_id)
        return plan

    def setup_of(self, plan: plan_pb2.Plan) -> setup.PlanSetup:
        return setup.resolve(
            self.registries,
            plan.meta.namespace,
            self.records.action(plan.meta.id),
            plan.project,
            plan.automation_profile,
        )

    def model_of(self, plan_setup: setup.PlanSetup) -> ModelActor | None:
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

    def staging(self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup | None = None) -> Staging:
        """The plan's staged view; read views need only the project's resources."""
        if plan_setup is not None:
            resources = plan_setup.resources
        else:
            project = self.registries.fetch(registry_pb2.Project, plan.meta.namespace, plan.project)
            resources = setup.resources_of(self.registries, plan.meta.namespace, project)
        return Staging(resources, self.records.changes(plan.meta.id))

    def node(self, plan_id: str, node_id: str) -> plan_pb2.DecisionNode:
        return next(n for n in self.records.nodes(plan_id) if n.id == node_id)

    def still(self, plan: plan_pb2.Plan, operation: str) -> None:
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

    # events and transitions ------------------------------------------------------------

    def publish(self, plan: plan_pb2.Plan, **payload: Any) -> events_pb2.Event:
        """A plan's event, fenced by its lease like every other write for it."""
        with self.records.fenced(plan.meta.id):
            return self.events.publish(
                events_pb2.Event(
                    namespace=plan.meta.namespace, plan_id=plan.meta.id, session_id=plan.session_id, **payload
                )
            )

    def transition(
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
        stamp = now()
        plan.phase, plan.state = phase, state
        timing = next((t for t in plan.timings if t.phase == phase), None)
        if timing is None:
            timing = plan.timings.add(phase=phase)
        if state == model.RUNNING:
            timing.start_time.CopyFrom(stamp)
            timing.ClearField("end_time")
        elif state in model.TERMINAL:
            if not timing.HasField("start_time"):
                timing.start_time.CopyFrom(stamp)
            timing.end_time.CopyFrom(stamp)
        if error is not None:
            plan.last_error.CopyFrom(error)
        with self.store.transaction():
            self.records.save(plan, journal=journal)
            for payload in before:
                self.publish(plan, **payload)
            if error is not None:
                self.publish(plan, plan_error=events_pb2.PlanError(error=error))
            if phase != old_phase:
                self.publish(
                    plan, plan_phase_changed=events_pb2.PlanPhaseChanged(from_phase=old_phase, to_phase=phase)
                )
            self.publish(
                plan,
                plan_state_changed=events_pb2.PlanStateChanged(
                    phase=phase, from_state=old_state, to_state=state, reason=reason
                ),
            )

    def transitions(self, plan: plan_pb2.Plan, done: model.Phase, next_phase: model.Phase) -> None:
        """``done`` succeeded and ``next_phase`` runs, in one transaction."""
        self.transition(plan, done, model.SUCCEEDED)
        self.transition(plan, next_phase, model.RUNNING)

    def record_error(self, plan: plan_pb2.Plan, error: common_pb2.ErrorInfo) -> None:
        """An error that leaves the plan's state as it is (a refused apply)."""
        plan.last_error.CopyFrom(error)
        with self.store.transaction():
            self.records.save(plan)
            self.publish(plan, plan_error=events_pb2.PlanError(error=error))

    def interrupted(self, plan: plan_pb2.Plan, message: str) -> None:
        """The running steps failed ``interrupted`` (only their rows written), then the plan."""
        interrupted: dict[int, plan_pb2.PlanStep] = {}
        for index, step in enumerate(self.records.steps(plan.meta.id)):
            if step.state == model.RUNNING:
                step.state = model.FAILED
                step.error.CopyFrom(common_pb2.ErrorInfo(code=model.INTERRUPTED, message=message))
                interrupted[index] = step
        with self.store.transaction():
            self.records.put_steps(plan.meta.id, interrupted)
            self.transition(
                plan,
                plan.phase,
                model.FAILED,
                reason=model.INTERRUPTED,
                error=common_pb2.ErrorInfo(code=model.INTERRUPTED, message=message),
            )

    # decisions ----------------------------------------------------------------------------

    def record_strategy(self, plan: plan_pb2.Plan, strategy: actor.Strategy) -> None:
        """Publish a decision per new node (each remembers its event's sequence), then save."""
        with self.store.transaction():
            for node in strategy.new_nodes:
                event = self.publish(plan, plan_decision_made=events_pb2.PlanDecisionMade(node=node))
                node.event_sequence = event.sequence
            self.records.save_nodes(plan.meta.id, strategy.nodes)
            self.records.save_steps(plan.meta.id, strategy.steps)
            progress(plan, strategy.steps)
            self.records.save(plan)

    def record_turn(
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
                event = self.publish(plan, plan_decision_made=events_pb2.PlanDecisionMade(node=node))
                node.event_sequence = event.sequence
            self.records.put_nodes(plan.meta.id, dict(enumerate(nodes[stored_nodes:], stored_nodes)))
            added = steps[stored_steps:]
            self.records.put_steps(plan.meta.id, dict(enumerate(added, stored_steps)))
            # New steps are pending: progress grows by those that count, as ``progress`` counts.
            plan.progress.total += sum(1 for s in added if not model.superseded(s))
            self.records.save(plan)
