"""The engine's side of a model plan: ``EngineRun`` (``model_actor.PlanRun``: the plan's records,
its events and the engine's step runner, budget and cancel checks, for one run).

Every state change goes through the collaborators a scripted plan uses (``PlanRecorder``,
``StepRunner``, halts.py), so a model plan's steps, decisions, costs and halts are recorded
and published exactly as a scripted plan's are, off the event loop (``PlanRecorder.read``/
``write``). A turn writes only its new decisions and steps. (``plan.correct`` of a model
plan: corrections.py.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from cleveragents.acp.facade.domain.models.deltas import Emit
from cleveragents.acp.facade.domain.plans import halts
from cleveragents.acp.facade.domain.plans.halts import Cancels
from cleveragents.acp.facade.domain.plans.recording import PlanRecorder
from cleveragents.acp.facade.domain.plans.setup import PlanSetup
from cleveragents.acp.facade.domain.plans.staging import Staging
from cleveragents.acp.facade.domain.plans.steps import StepRunner
from cleveragents.acp.facade.domain.registries.specs import DEFAULT_MAX_STEPS
from cleveragents.acp.v1 import events_pb2, plan_pb2


class _Loaded:
    """What a run starts from, read in one snapshot."""

    def __init__(self, recorder: PlanRecorder, plan: plan_pb2.Plan, plan_setup: PlanSetup) -> None:
        records = recorder.records
        plan_id = plan.meta.id
        self.staging: Staging = recorder.staging(plan, plan_setup)
        self.nodes = records.nodes(plan_id)
        self.steps = records.steps(plan_id)
        self.prompt = records.prompt(plan_id)
        self.conversation = records.conversation(plan_id)


class EngineRun:
    def __init__(
        self,
        recorder: PlanRecorder,
        runner: StepRunner,
        plan: plan_pb2.Plan,
        plan_setup: PlanSetup,
        cancel: asyncio.Event,
        loaded: _Loaded,
    ) -> None:
        self.recorder = recorder
        self.runner = runner
        self.cancels: Cancels = runner.cancels
        self.plan = plan
        self.setup = plan_setup
        self.cancel = cancel
        self._id = plan.meta.id
        self._staging = loaded.staging
        self._nodes = loaded.nodes
        self._steps = loaded.steps
        # How many nodes and steps the store holds: a turn writes those past them.
        self._stored = (len(self._nodes), len(self._steps))
        self._prompt = loaded.prompt
        self._conversation = loaded.conversation
        # A turn's last text piece, held back by the model client: published first thing in
        # the run's next write (the turn's decisions), or by ``flush`` when the run ends first.
        self._held: list[events_pb2.TextDelta] = []

    @classmethod
    async def open(
        cls,
        recorder: PlanRecorder,
        runner: StepRunner,
        plan: plan_pb2.Plan,
        plan_setup: PlanSetup,
        cancel: asyncio.Event,
    ) -> EngineRun:
        loaded = await recorder.read(lambda: _Loaded(recorder, plan, plan_setup))
        return cls(recorder, runner, plan, plan_setup, cancel, loaded)

    def prompt(self) -> plan_pb2.GetPlanPromptResponse:
        if self._prompt is None:
            raise RuntimeError(f"plan {self._id} runs without a recorded prompt")
        return self._prompt

    def conversation(self) -> list[dict[str, Any]]:
        return list(self._conversation)

    def nodes(self) -> list[plan_pb2.DecisionNode]:
        return self._nodes

    def steps(self) -> list[plan_pb2.PlanStep]:
        return self._steps

    def step_limit(self) -> tuple[int, str]:
        given = self.setup.profile.max_steps
        return (given, "the automation profile allows") if given else (DEFAULT_MAX_STEPS, "the default is")

    def check_cancel(self) -> None:
        self.cancels.check(self._id, self.cancel)

    def stop(self, code: str, message: str) -> NoReturn:
        halts.fail(code, message)

    def text(self, turn: int) -> Emit:
        name = self.setup.actor.name

        async def emit(index: int, text: str) -> None:
            delta = events_pb2.TextDelta(actor=name, turn=turn, index=index, text=text)
            await self.recorder.write(lambda: self.recorder.publish(self.plan, plan_text_delta=delta))

        return emit

    def hold(self, turn: int) -> Callable[[int, str], None]:
        name = self.setup.actor.name

        def keep(index: int, text: str) -> None:
            self._held.append(events_pb2.TextDelta(actor=name, turn=turn, index=index, text=text))

        return keep

    def _publish_held(self) -> None:
        """Inside a write: the held text pieces, before anything else the write publishes."""
        for delta in self._held:
            self.recorder.publish(self.plan, plan_text_delta=delta)

    async def flush(self) -> None:
        """Publish held text now (no write when none is held): the run ends, or halts,
        before a turn's decisions are written."""
        if self._held:
            await self.recorder.write(self._publish_held)
            self._held.clear()

    async def charge(self, cost: float, tokens: int, what: str) -> None:
        """Add a turn's usage; the plan is saved with the turn's decisions (``decide``), or by
        the halt when it crosses the budget."""
        self.plan.cost.tokens += tokens
        halts.charge(self.plan, cost, what)

    async def decide(
        self,
        nodes: Sequence[plan_pb2.DecisionNode],
        steps: Sequence[plan_pb2.PlanStep],
        entry: dict[str, Any],
    ) -> None:
        """The turn appended ``nodes`` (and any new steps) to the run's own lists: only the
        rows past what the store holds are written, so a turn costs O(1) rows."""
        stored = self._stored

        def record() -> None:
            self._publish_held()
            self.recorder.record_turn(self.plan, self._nodes, self._steps, stored)
            self.recorder.records.add_conversation(self._id, [entry])

        await self.recorder.write(record)
        self._held.clear()
        self._stored = (len(self._nodes), len(self._steps))

    async def remember(self, entry: dict[str, Any]) -> None:
        await self.recorder.write(lambda: self.recorder.records.add_conversation(self._id, [entry]))

    async def run_step(self, step: plan_pb2.PlanStep) -> events_pb2.ToolCompleted:
        return await self.runner.run(
            self.plan, self.setup, self._staging, self._steps, step, self.cancel, halt=False
        )
