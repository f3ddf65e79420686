"""The model-backed session orchestrator: a session whose orchestrator actor has provider
``openai`` answers ``session.tell`` from the model.

The model gets the actor's system prompt (or one saying what it is and which actions the
namespace has) and skills, then as much of the session's history as fits the session's
context budget, newest kept first. Its text streams out as ``session.text_delta`` events;
each turn's text becomes a reply. It may call ``start_plan`` with one of the namespace's
actions, which starts the plan exactly as ``/use`` does; the started plan is a reply of its
own (with ``plan_id``) and its outcome goes back to the model. Slash commands (``/help``,
``/actions``, ``/use``, ``/close``) are still answered by the built-in orchestrator.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Protocol

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.models.client import ChatModels
from cleveragents.acp.facade.domain.models.deltas import Emit
from cleveragents.acp.facade.domain.models.failures import ModelError
from cleveragents.acp.facade.domain.models.functions import CallError, arguments, function_tool
from cleveragents.acp.facade.domain.models.wire import Turn
from cleveragents.acp.facade.domain.orchestrators.builtin import BuiltinOrchestrator, Outcome, Reply, started
from cleveragents.acp.facade.domain.registries import Registries
from cleveragents.acp.v1 import registry_pb2, session_pb2

START_PLAN = "start_plan"
# Model turns one tell may take (each after a round of start_plan calls).
MAX_TURNS = 8
# Actions named in the start_plan tool, at most.
MAX_ACTIONS = 200
CHARS_PER_TOKEN = 4
_ROLES = {
    session_pb2.MESSAGE_ROLE_USER: "user",
    session_pb2.MESSAGE_ROLE_ORCHESTRATOR: "assistant",
    session_pb2.MESSAGE_ROLE_SYSTEM: "system",
}


class SessionSide(Protocol):
    """What the orchestrator reads and writes of a session, provided by ``Sessions``."""

    def history(self, session_id: str) -> list[session_pb2.Message]: ...
    def token_budget(self, session: session_pb2.Session) -> int: ...
    def text(self, session: session_pb2.Session, actor: str, turn: int) -> Emit: ...
    def used(self, prompt_tokens: int, completion_tokens: int) -> None: ...


def _tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


class ModelOrchestrator:
    provider = "openai"

    def __init__(
        self, registries: Registries, models: ChatModels, builtin: BuiltinOrchestrator, side: SessionSide
    ) -> None:
        self.registries = registries
        self.models = models
        self.builtin = builtin
        self.side = side

    async def respond(self, ctx: CallContext, session: session_pb2.Session, text: str) -> Outcome:
        if text.lstrip().startswith("/"):
            return await self.builtin.respond(ctx, session, text)
        actor, actions, messages = await self.registries.store.read(lambda _store: self._given(session))
        tools = [self._start_plan_tool(actions)] if actions and self._can_start(session) else []
        replies: list[Reply] = []
        refused_in_a_row = 0
        for number in range(1, MAX_TURNS + 1):
            try:
                turn = await self.models.stream(
                    actor.name, actor.spec, messages, tools, self.side.text(session, actor.name, number)
                )
            except ModelError as failure:
                raise failure.to_acp() from None
            if turn.usage is not None:
                self.side.used(turn.usage.prompt_tokens, turn.usage.completion_tokens)
            if turn.text:
                replies.append(Reply(turn.text))
            if not turn.tool_calls:
                break
            messages.append(_assistant(turn))
            refused = 0
            for call in turn.tool_calls:
                answer, reply = await self._call(ctx, session, call.name, call.arguments)
                refused += reply is None
                if reply is not None:
                    replies.append(reply)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": answer})
            refused_in_a_row = refused_in_a_row + refused if refused == len(turn.tool_calls) else 0
            if refused_in_a_row >= self.models.settings.max_tool_errors:
                raise ModelError(
                    "model_tool_errors",
                    f"orchestrator {actor.name!r} made {refused_in_a_row} tool calls in a row "
                    "that could not run",
                    {"actor": actor.name},
                ).to_acp()
        else:
            replies.append(Reply(f"(The orchestrator stopped after {MAX_TURNS} model turns in one message.)"))
        return Outcome(tuple(replies) or (Reply("(The model answered with no text.)"),))

    # what the model is given ---------------------------------------------------------

    def _given(
        self, session: session_pb2.Session
    ) -> tuple[registry_pb2.Actor, list[registry_pb2.Action], list[dict[str, Any]]]:
        """The actor, the actions it may start and the messages of its first turn, read in
        one snapshot (on a store reader thread: the history may be long)."""
        actor = self.registries.fetch(registry_pb2.Actor, session.meta.namespace, session.orchestrator)
        actions = self._actions(session)
        return actor, actions, self._messages(session, actor, actions)

    def _can_start(self, session: session_pb2.Session) -> bool:
        return self.builtin.plan_starter is not None and bool(session.project)

    def _actions(self, session: session_pb2.Session) -> list[registry_pb2.Action]:
        found = self.registries.entries("action", session.meta.namespace)
        return [a for a in found if isinstance(a, registry_pb2.Action)][:MAX_ACTIONS]

    @staticmethod
    def _start_plan_tool(actions: Sequence[registry_pb2.Action]) -> dict[str, Any]:
        return function_tool(
            START_PLAN,
            "Start a plan from one of the namespace's actions on the session's project, as /use does. "
            "It runs in the background; the answer says its id and state.",
            {
                "type": "object",
                "properties": {
                    "action": {"type": "string", "enum": [a.name for a in actions]},
                    "inputs": {"type": "object", "description": "The action's inputs, by name."},
                    "reason": {"type": "string", "description": "Why you start it, in one sentence."},
                },
                "required": ["action"],
            },
        )

    def _system(
        self, session: session_pb2.Session, actor: registry_pb2.Actor, actions: Sequence[registry_pb2.Action]
    ) -> str:
        ns = session.meta.namespace
        parts = [
            actor.spec.system_prompt
            or (
                f"You are the orchestrator of a CleverAgents session in namespace {ns!r}"
                + (f" on project {session.project!r}" if session.project else "")
                + ". Answer the user briefly."
            )
        ]
        if actions and self._can_start(session):
            parts.append(
                f"To carry out work on the project, call {START_PLAN} with one of these actions:\n"
                + "\n".join(f"- {a.name}" + (f": {a.description}" if a.description else "") for a in actions)
            )
        for name in actor.spec.skills:
            skill = self.registries.find("skill", ns, name)
            if isinstance(skill, registry_pb2.Skill):
                parts.append(f"# Skill {name}\n{skill.spec.instructions}")
        return "\n\n".join(parts)

    def _messages(
        self, session: session_pb2.Session, actor: registry_pb2.Actor, actions: Sequence[registry_pb2.Action]
    ) -> list[dict[str, Any]]:
        """The system message, then the newest messages of the history that fit the budget
        (the newest, the user's message, always)."""
        system = self._system(session, actor, actions)
        left = self.side.token_budget(session) - _tokens(system)
        history = self.side.history(session.meta.id)
        kept: list[dict[str, Any]] = []
        for message in reversed(history):
            cost = _tokens(message.content)
            if kept and cost > left:
                break
            left -= cost
            kept.append({"role": _ROLES.get(message.role, "user"), "content": message.content})
        return [{"role": "system", "content": system}, *reversed(kept)]

    # start_plan ----------------------------------------------------------------------

    async def _call(
        self, ctx: CallContext, session: session_pb2.Session, name: str, text: str
    ) -> tuple[str, Reply | None]:
        """The answer to send back to the model, and the reply to show (None: refused)."""
        starter = self.builtin.plan_starter
        try:
            if name != START_PLAN or starter is None or not session.project:
                raise CallError(
                    f"there is no tool {name!r}" + (f"; the tool is {START_PLAN}" if starter else "")
                )
            args, _ = arguments(text)
            action, inputs = args.get("action"), args.get("inputs", {})
            if not isinstance(action, str) or not action:
                raise CallError("name the action to start in 'action'")
            if not isinstance(inputs, dict):
                raise CallError("'inputs' must be a JSON object")
        except CallError as exc:
            return json.dumps({"error": {"code": "INVALID_PARAMS", "message": str(exc)}}), None
        try:
            plan = await starter.start_plan(
                ctx,
                namespace=session.meta.namespace,
                action=action,
                project=session.project,
                session_id=session.meta.id,
                inputs=inputs,
            )
        except ACPError as exc:
            reply = Reply(f"Could not start a plan from action {action!r}: {exc.code}: {exc.message}")
            return json.dumps({"error": {"code": exc.code, "message": exc.message}}), reply
        reply = started(plan)
        return json.dumps({"plan_id": plan.meta.id, "message": reply.content}), reply


def _assistant(turn: Turn) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": turn.text or None,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in turn.tool_calls
        ],
    }
