"""The built-in session orchestrator: deterministic, command-driven, no model behind it.

It answers ``/help``, lists the namespace's actions (``/actions``), starts a plan from an
action (``/use <action> key=value ...``) through a ``PlanStarter`` when the server has
one, and closes the session (``/close``). Any other text gets a reply saying what it can
do. The commands are documented in docs/sessions.md.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass
from typing import Any, Protocol

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.registries import Registries
from cleveragents.acp.v1 import plan_pb2, registry_pb2, session_pb2

USAGE_USE = "/use <action> key=value ..."
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


class PlanStarter(Protocol):
    """What the orchestrator needs from the plan engine to honour ``/use``."""

    async def start_plan(
        self,
        ctx: CallContext,
        *,
        namespace: str,
        action: str,
        project: str,
        session_id: str,
        inputs: dict[str, Any],
    ) -> plan_pb2.Plan: ...


@dataclass(frozen=True)
class Reply:
    content: str
    plan_id: str = ""


@dataclass(frozen=True)
class Outcome:
    replies: tuple[Reply, ...]
    # The orchestrator asked to close the session after these replies.
    close: bool = False


class Orchestrator(Protocol):
    """Answers one user message of a session; ``tell`` stores what it returns."""

    async def respond(self, ctx: CallContext, session: session_pb2.Session, text: str) -> Outcome: ...


class UseArgumentError(ValueError):
    pass


def _json_or_text(value: str) -> Any:
    """JSON when the value parses as JSON (finite numbers only), else the text itself."""

    def refuse(token: str) -> Any:
        raise ValueError(token)

    def finite(token: str) -> float:
        number = float(token)
        if not math.isfinite(number):
            raise ValueError(token)
        return number

    try:
        return json.loads(value, parse_constant=refuse, parse_float=finite)
    except ValueError:
        return value


def parse_use(arguments: str) -> tuple[str, dict[str, Any]]:
    """``<action> key=value ...`` as (action, inputs); shell-style quoting groups words."""
    try:
        words = shlex.split(arguments)
    except ValueError as exc:
        raise UseArgumentError(f"cannot split the arguments ({exc})") from None
    if not words:
        raise UseArgumentError("name the action to use")
    action, *pairs = words
    if "=" in action:
        raise UseArgumentError(f"the first argument must be the action name, not {action!r}")
    inputs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UseArgumentError(f"{pair!r} is not key=value")
        if not _KEY.fullmatch(key):
            raise UseArgumentError(f"{key!r} is not a valid input name (letters, digits, _ and -)")
        if key in inputs:
            raise UseArgumentError(f"input {key!r} is given twice")
        inputs[key] = _json_or_text(value)
    return action, inputs


def _enum_word(name: str, prefix: str) -> str:
    return name.removeprefix(prefix).lower()


class BuiltinOrchestrator:
    """The provider ``orchestrator``: the deterministic orchestrator every namespace has."""

    provider = "orchestrator"

    def __init__(self, registries: Registries, plan_starter: PlanStarter | None = None) -> None:
        self.registries = registries
        self.plan_starter = plan_starter

    @staticmethod
    def capabilities() -> str:
        return (
            "I can list the actions of this namespace (/actions), start a plan from one "
            f"({USAGE_USE}), close this session (/close), and show help (/help)."
        )

    def help_text(self, session: session_pb2.Session) -> str:
        project = f"project {session.project!r}" if session.project else "the session's project (none set)"
        return "\n".join(
            [
                "I am the built-in orchestrator; I follow commands, one per message:",
                "  /help      this list",
                f"  /actions   the actions of namespace {session.meta.namespace!r}",
                f"  {USAGE_USE}",
                f"             start a plan from an action on {project}; a value is JSON when it",
                "             parses as JSON, else text; quote with single quotes: note='{\"a\": 1}'",
                "  /close     close this session; session.resume reopens it",
            ]
        )

    async def respond(self, ctx: CallContext, session: session_pb2.Session, text: str) -> Outcome:
        words = text.split(maxsplit=1)
        command = words[0] if words else ""
        arguments = words[1] if len(words) > 1 else ""
        if command == "/help":
            return Outcome((Reply(self.help_text(session)),))
        if command == "/actions":
            listed = await self.registries.store.read(lambda _store: self._actions(session.meta.namespace))
            return Outcome((Reply(listed),))
        if command == "/use":
            return Outcome((await self._use(ctx, session, arguments),))
        if command == "/close":
            return Outcome((Reply("Session closed; session.resume reopens it."),), close=True)
        if command.startswith("/"):
            return Outcome((Reply(f"Unknown command {command}. {self.capabilities()}"),))
        return Outcome(
            (Reply(f"I am the built-in orchestrator and do not interpret free text. {self.capabilities()}"),)
        )

    def _actions(self, namespace: str) -> str:
        actions = [
            a for a in self.registries.entries("action", namespace) if isinstance(a, registry_pb2.Action)
        ]
        if not actions:
            return (
                f"No actions are registered in namespace {namespace!r} yet; add one with action.add, "
                "then start it with /use <action>."
            )
        lines = [f"Actions in namespace {namespace!r}:"]
        lines.extend(f"  - {a.name}: {a.description}" if a.description else f"  - {a.name}" for a in actions)
        lines.append(f"Start one with: {USAGE_USE}")
        return "\n".join(lines)

    async def _use(self, ctx: CallContext, session: session_pb2.Session, arguments: str) -> Reply:
        try:
            action, inputs = parse_use(arguments)
        except UseArgumentError as exc:
            return Reply(f"Cannot start a plan: {exc}. Usage: {USAGE_USE}")
        if self.plan_starter is None:
            return Reply(
                f"Plans are not available on this server, so I cannot start action {action!r}. "
                "I can still list actions (/actions)."
            )
        if not session.project:
            return Reply(
                f"This session has no project, and a plan from action {action!r} needs one to work on; "
                "create a session with a project to use /use."
            )
        try:
            plan = await self.plan_starter.start_plan(
                ctx,
                namespace=session.meta.namespace,
                action=action,
                project=session.project,
                session_id=session.meta.id,
                inputs=inputs,
            )
        except ACPError as exc:
            return Reply(f"Could not start a plan from action {action!r}: {exc.code}: {exc.message}")
        return started(plan)


def started(plan: plan_pb2.Plan) -> Reply:
    """The reply that reports a plan started from a session."""
    phase = _enum_word(plan_pb2.PlanPhase.Name(plan.phase), "PLAN_PHASE_")
    state = _enum_word(plan_pb2.PlanState.Name(plan.state), "PLAN_STATE_")
    plan_id = plan.meta.id
    # A pending plan waits for plan.execute: a watch until its run ends would wait for that.
    if plan.state == plan_pb2.PLAN_STATE_PENDING:
        follow = f"Run it with `agents plan execute {plan_id} --wait` (it ends when the run does)"
    else:
        follow = f"Follow its run with `agents events watch --plan {plan_id} --until-done`"
    return Reply(
        f"Started plan {plan_id} from action {plan.action!r} on project {plan.project!r} "
        f"(phase {phase}, state {state}). {follow}, or see it with `agents plan status {plan_id}`.",
        plan_id=plan_id,
    )
