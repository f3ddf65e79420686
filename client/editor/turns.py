"""``session/prompt`` as a background turn (ACP 1.3): the text is told with
``background: true``, the turn's events become ``session/update`` notifications (streamed text
as ``agent_message_chunk``, replies that did not stream as whole chunks), each plan it starts is
followed to the end of its run as a ``plan`` and tool calls, and the turn's end is the
``stopReason``. A plan ``awaiting_approval`` asks the person (``Permissions``: the request as
``session/request_permission``, the answer as ``approval.answer``) and is followed on once
answered; unanswered, it stays waiting and the prompt ends. ``session/cancel`` cancels the
turn (and its plans) with ``session.cancel_turn``; a permission request outstanding then is
given up (the approval is never answered by the bridge).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from acp import RequestError, helpers
from acp.interfaces import Client

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.editor import modes
from cleveragents.acp.client.editor.permissions import Decision, Permissions
from cleveragents.acp.client.editor.plans import PlanView
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import events_pb2, plan_pb2, session_pb2

TURN_EVENTS = ["session.turn_started", "session.text_delta", "session.message", "session.turn_completed"]
PLAN_EVENTS = [
    "plan.state_changed",
    "plan.phase_changed",
    "tool.invoked",
    "tool.completed",
    "plan.apply_completed",
    "validation.completed",
    "approval.decided",
]
# A plan that rests (staged, or waiting to be executed) for this long without an event has
# ended its run: nothing more happens to it without a person.
REST_SECONDS = 3.0
_ENDED = {plan_pb2.PLAN_STATE_FAILED, plan_pb2.PLAN_STATE_CANCELLED, plan_pb2.PLAN_STATE_ROLLED_BACK}
_STOP = {
    session_pb2.TURN_STATE_SUCCEEDED: "end_turn",
    session_pb2.TURN_STATE_CANCELLED: "cancelled",
    session_pb2.TURN_STATE_INTERRUPTED: "cancelled",
}

Folders = Callable[[str, str], Awaitable[dict[str, str]]]


def run_over(plan: plan_pb2.Plan) -> bool:
    if plan.state in _ENDED:
        return True
    return plan.phase == plan_pb2.PLAN_PHASE_APPLY and plan.state == plan_pb2.PLAN_STATE_SUCCEEDED


def awaiting(plan: plan_pb2.Plan) -> bool:
    return plan.state == plan_pb2.PLAN_STATE_AWAITING_APPROVAL


def resting(plan: plan_pb2.Plan) -> bool:
    return plan.phase != plan_pb2.PLAN_PHASE_STRATEGIZE and plan.state in (
        plan_pb2.PLAN_STATE_SUCCEEDED,
        plan_pb2.PLAN_STATE_PENDING,
    )


def staged_for_good(plan: plan_pb2.Plan) -> bool:
    """Executed under a mode that never applies by itself: nothing follows without a person."""
    mode = modes.BY_PROFILE.get(plan.automation_profile)
    executed = plan.phase == plan_pb2.PLAN_PHASE_EXECUTE and plan.state == plan_pb2.PLAN_STATE_SUCCEEDED
    return executed and mode is not None and not mode.spec["auto_apply"]


class PromptTurn:
    """One ``session/prompt``, from the tell to its stop reason."""

    def __init__(
        self,
        client: ACPClient,
        editor: Client,
        permissions: Permissions,
        folders: Folders,
        session_id: str,
        current: Callable[[], Awaitable[session_pb2.Session]],
    ) -> None:
        self.client = client
        self.editor = editor
        self.permissions = permissions
        self.folders = folders
        self.session_id = session_id
        self.after_sequence = 0
        # The session as stored now (its mode may have changed since the prompt began).
        self.current = current
        self.turn_id = ""
        self.cancelled = False
        self._plans: list[str] = []
        self._task: asyncio.Task[Any] | None = None
        # The permission request outstanding now (session/cancel gives it up).
        self._asking: asyncio.Task[Decision | None] | None = None
        # Set once session/cancel has cancelled the turn and its plans (the prompt answers after).
        self._cancelled_all = asyncio.Event()

    async def send(self, update: Any) -> None:
        await self.editor.session_update(self.session_id, update)

    async def run(self, text: str) -> str:
        told = await self.client.call(
            "session.tell", session_id=self.session_id, content=text, background=True
        )
        self.turn_id = told.turn.id  # type: ignore[attr-defined]
        turn = await self._follow_turn()
        for plan_id in [*self._plans, *(p for p in turn.plan_ids if p not in self._plans)]:
            if self.cancelled:
                break
            await self._follow_plan(plan_id)
        if self.cancelled:
            await self._cancelled_all.wait()
            return "cancelled"
        if turn.state == session_pb2.TURN_STATE_FAILED:
            raise RequestError(
                -32603, f"the turn failed: {turn.error.code}: {turn.error.message}", {"turn_id": turn.id}
            )
        return _STOP.get(turn.state, "end_turn")

    async def _follow_turn(self) -> session_pb2.Turn:
        streamed: dict[int, list[str]] = {}
        # After the last event an earlier prompt of this session saw: a long session's past
        # events are not read again (0, the first time: all retained, ours among them).
        after = self.after_sequence
        async for event in self.client.subscribe(
            session_id=self.session_id, event_type=TURN_EVENTS, after_sequence=after
        ):
            self.after_sequence = event.sequence
            kind = event.WhichOneof("payload")
            if kind == "session_text_delta" and event.session_text_delta.turn_id == self.turn_id:
                delta = event.session_text_delta
                streamed.setdefault(delta.turn, []).append(delta.text)
                await self.send(helpers.update_agent_message_text(delta.text))
            elif kind == "session_message" and event.session_message.message.turn_id == self.turn_id:
                await self._reply(event.session_message.message, streamed)
            elif kind == "session_turn_completed" and event.session_turn_completed.turn.id == self.turn_id:
                return event.session_turn_completed.turn
        raise RequestError(-32603, "the event stream ended before the turn did", {"turn_id": self.turn_id})

    async def _reply(self, message: session_pb2.Message, streamed: dict[int, list[str]]) -> None:
        if message.role == session_pb2.MESSAGE_ROLE_USER:
            return
        if message.plan_id and message.plan_id not in self._plans:
            self._plans.append(message.plan_id)
        for key, parts in list(streamed.items()):
            if "".join(parts) == message.content:
                del streamed[key]
                return
        await self.send(helpers.update_agent_message_text(_paragraph(message.content)))

    async def _follow_plan(self, plan_id: str) -> None:
        if plan_id not in self._plans:
            # session/cancel cancels every plan the prompt follows (one the turn's messages
            # did not name too).
            self._plans.append(plan_id)
        status = await self.client.call("plan.status", plan_id=plan_id)
        plan: plan_pb2.Plan = status.plan  # type: ignore[attr-defined]
        view = PlanView(self.client, plan_id, await self.folders(plan.meta.namespace, plan.project))
        await self._refresh(view)
        events: asyncio.Queue[events_pb2.Event | None] = asyncio.Queue()
        pump = asyncio.create_task(self._pump(plan_id, events))
        # Set when the run stopped at a request the person did not allow (its note was said).
        told = False
        try:
            while not (run_over(view.plan) or staged_for_good(view.plan) or self.cancelled):
                if awaiting(view.plan):
                    asked = await self._ask(view)
                    if self.cancelled:
                        break
                    if asked is not None:
                        if asked.approval is None or (not asked.allowed and asked.approval.kind == "apply"):
                            # Unanswered (it stays pending) or an apply kept staged: nothing
                            # more happens to the plan without a person.
                            told = True
                            break
                        await self._refresh(view)
                        continue
                    # None pending (answered elsewhere just now): the plan's events follow.
                try:
                    event = await asyncio.wait_for(events.get(), REST_SECONDS if resting(view.plan) else None)
                except TimeoutError:
                    await self._refresh(view)
                    if resting(view.plan):
                        break
                    continue
                if event is None:
                    break
                await self._refresh(view)
        finally:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)
        if self.cancelled:
            return
        await self._refresh(view)
        if not told:
            await self.send(helpers.update_agent_message_text(_paragraph(outcome(view.plan))))

    async def _ask(self, view: PlanView) -> Decision | None:
        """Ask the plan's pending request; None when none was (it was answered meanwhile)."""
        self._asking = asyncio.create_task(self.permissions.ask(self.session_id, view))
        try:
            decision = await self._asking
        except asyncio.CancelledError:
            if not self.cancelled:
                raise
            return None
        finally:
            self._asking = None
        if decision is not None:
            await self.send(helpers.update_agent_message_text(_paragraph(decision.note)))
            if decision.mode is not None:
                await self.send(helpers.update_current_mode(decision.mode.id))
        return decision

    async def _pump(self, plan_id: str, events: asyncio.Queue[events_pb2.Event | None]) -> None:
        try:
            async for event in self.client.subscribe(plan_id=plan_id, event_type=PLAN_EVENTS):
                await events.put(event)
        except ACPError as exc:
            sys.stderr.write(
                f"agents editor: the events of plan {plan_id} stopped: {exc.code}: {exc.message}\n"
            )
        finally:
            await events.put(None)

    async def _refresh(self, view: PlanView) -> None:
        for update in await view.refresh():
            await self.send(update)

    async def cancel(self) -> None:
        """Stop the turn (and the plans it started); the prompt then answers ``cancelled``."""
        self.cancelled = True
        if self._asking is not None:
            # The client answers the request ``cancelled``; the bridge never answers the approval.
            self._asking.cancel()
        try:
            await self._cancel_all()
        finally:
            self._cancelled_all.set()

    async def _cancel_all(self) -> None:
        if not self.turn_id:
            return
        with contextlib.suppress(ACPError):
            await self.client.call(
                "session.cancel_turn", session_id=self.session_id, turn_id=self.turn_id, cancel_plans=True
            )
        for plan_id in self._plans:
            with contextlib.suppress(ACPError):
                await self.client.call(
                    "plan.cancel",
                    plan_id=plan_id,
                    reason="cancelled from the editor (Zed ACP session/cancel)",
                )


def outcome(plan: plan_pb2.Plan) -> str:
    pid = plan.meta.id
    if plan.phase == plan_pb2.PLAN_PHASE_APPLY and plan.state == plan_pb2.PLAN_STATE_SUCCEEDED:
        return f"Plan {pid} applied."
    if plan.state == plan_pb2.PLAN_STATE_FAILED:
        return f"Plan {pid} failed: {plan.last_error.code}: {plan.last_error.message}"
    if plan.state in _ENDED:
        return f"Plan {pid} ended {plan_pb2.PlanState.Name(plan.state).removeprefix('PLAN_STATE_').lower()}."
    if awaiting(plan):
        return f"Plan {pid} waits for approval: `agents approval list --state pending` shows the request."
    if plan.phase == plan_pb2.PLAN_PHASE_EXECUTE and plan.state == plan_pb2.PLAN_STATE_SUCCEEDED:
        return (
            f"Plan {pid} is staged: `agents plan diff {pid}` shows it, `agents plan apply {pid}` applies it."
        )
    return f"Plan {pid} waits: `agents plan execute {pid}` runs it."


def _paragraph(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"
