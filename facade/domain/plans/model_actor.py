"""The ``openai`` actor of a plan: a model that chooses each step after seeing the results of
the last, through function calls.

Strategize records the prompt and one root decision; the work happens in Execute, one model
turn at a time: the model's text streams out as ``plan.text_delta`` events; each function call
it makes becomes a decision node (its choice, and the reason it gave) and, when it names a
tool it may use with arguments that parse, a step the engine runs like a scripted one
(``tool.invoked``/``tool.completed``); the result goes back to the model. The run ends when the
model answers without calling a tool, at ``max_steps``, at the cost budget (the server's
reported ``usage`` x ``cost_per_1k_tokens``), on cancel, or when the model keeps making calls
that cannot run.

Decisions form a chain (each call's node is the child of the one before), so a correction at
a node supersedes it and everything after it; the conversation is cut back to just before that
call and the correction is added as the user's message, and the next execute goes on from
there.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.models.client import ChatModels
from cleveragents.acp.facade.domain.models.deltas import Emit
from cleveragents.acp.facade.domain.models.failures import ModelCancelledError, ModelError
from cleveragents.acp.facade.domain.models.functions import (
    CallError,
    Functions,
    arguments,
    command_parameters,
)
from cleveragents.acp.facade.domain.models.wire import ToolCall, Turn, Usage
from cleveragents.acp.facade.domain.plans import actor, model
from cleveragents.acp.facade.domain.plans.setup import PlanSetup
from cleveragents.acp.facade.domain.registries import BUILTIN_TOOLS, Registries
from cleveragents.acp.v1 import common_pb2, events_pb2, plan_pb2, registry_pb2

OPENAI = "openai"
QUESTION = "What should the actor do next?"
FINISH = "finish: answer without calling a tool"
# A tool result sent back to the model, at most (the rest is cut, saying so).
MAX_RESULT_CHARS = 32_000
# Text of the model kept as a decision's rationale, at most.
MAX_RATIONALE_CHARS = 2_000
CHARS_PER_TOKEN = 4
NOT_RUN = "not run: the plan stopped before this call"


class PlanRun(Protocol):
    """What the model actor needs from the engine while a plan runs."""

    plan: plan_pb2.Plan
    setup: PlanSetup
    cancel: asyncio.Event

    def prompt(self) -> plan_pb2.GetPlanPromptResponse: ...
    def conversation(self) -> list[dict[str, Any]]: ...
    def nodes(self) -> list[plan_pb2.DecisionNode]: ...
    def steps(self) -> list[plan_pb2.PlanStep]: ...
    def step_limit(self) -> tuple[int, str]: ...
    def check_cancel(self) -> None: ...
    def stop(self, code: str, message: str) -> NoReturn: ...
    def text(self, turn: int) -> Emit: ...
    def hold(self, turn: int) -> Callable[[int, str], None]: ...
    async def charge(self, cost: float, tokens: int, what: str) -> None: ...
    async def decide(
        self,
        nodes: Sequence[plan_pb2.DecisionNode],
        steps: Sequence[plan_pb2.PlanStep],
        entry: dict[str, Any],
    ) -> None: ...
    async def remember(self, entry: dict[str, Any]) -> None: ...
    async def run_step(self, step: plan_pb2.PlanStep) -> events_pb2.ToolCompleted: ...


def is_model(plan_setup: PlanSetup) -> bool:
    return plan_setup.actor.spec.provider == OPENAI


def estimate(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"\n[... {len(text) - limit} more characters cut]"


def wire_messages(
    first: Sequence[plan_pb2.PromptMessage], entries: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The chat messages of a conversation: the first messages, then each entry; a tool call
    left without its result (the plan stopped in between) is answered ``NOT_RUN``."""
    messages: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in first]
    waiting: list[str] = []

    def settle() -> None:
        messages.extend({"role": "tool", "tool_call_id": i, "content": NOT_RUN} for i in waiting)
        waiting.clear()

    for entry in entries:
        role = entry["role"]
        if role == "tool":
            if entry["tool_call_id"] in waiting:
                waiting.remove(entry["tool_call_id"])
                messages.append(
                    {"role": "tool", "tool_call_id": entry["tool_call_id"], "content": entry["content"]}
                )
            continue
        settle()
        if role == "assistant":
            message: dict[str, Any] = {"role": "assistant", "content": entry.get("content") or None}
            calls = entry.get("tool_calls") or []
            if calls:
                message["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {"name": c["function"], "arguments": c["arguments"]},
                    }
                    for c in calls
                ]
                waiting.extend(c["id"] for c in calls)
            messages.append(message)
        else:
            messages.append({"role": role, "content": entry["content"]})
    settle()
    return messages


class ModelActor:
    def __init__(self, registries: Registries, models: ChatModels) -> None:
        self.registries = registries
        self.models = models

    # what the model is given ---------------------------------------------------------

    def functions(self, plan_setup: PlanSetup) -> Functions:
        """The built-in file tools, and the command tools the automation profile allows."""
        table = Functions()
        for tool in sorted(BUILTIN_TOOLS):
            table.add_builtin(tool)
        for name in plan_setup.profile.allowed_tools:
            if name in BUILTIN_TOOLS:
                continue
            entry = self.registries.find("tool", plan_setup.namespace, name)
            if not isinstance(entry, registry_pb2.Tool):
                continue
            properties, required = command_parameters(entry.spec.argv)
            about = entry.description or f"Run the command {' '.join(entry.spec.argv)!r}"
            table.add(name, f"{about} (runs in a scratch copy of the staged project).", properties, required)
        return table

    def prompt(
        self, plan_setup: PlanSetup, inputs: dict[str, Any], corrections: Sequence[str]
    ) -> plan_pb2.GetPlanPromptResponse:
        """The scripted assembly (what ``plan.prompt`` shows), plus the chat messages: the
        system message holds the system prompt, skills and context, the user message the task."""
        given = actor.prompt(plan_setup, inputs, corrections)
        task = given.action_prompt or (
            f"Carry out action {plan_setup.action.name!r} on project {plan_setup.project.name!r}."
        )
        given.messages.add(role="system", content="\n\n".join(actor.briefing(plan_setup, given.context)))
        given.messages.add(role="user", content=task)
        given.tools.extend(self.functions(plan_setup).names)
        return given

    def strategize(self, plan_setup: PlanSetup, plan: plan_pb2.Plan) -> actor.Strategy:
        spec = plan_setup.actor.spec
        choice = f"let model {spec.model!r} choose each step"
        root = plan_pb2.DecisionNode(
            id="d1",
            question=f"How should action {plan.action!r} be carried out on project {plan.project!r}?",
            options=[
                plan_pb2.DecisionOption(
                    label=choice, description="one tool call at a time, seeing each result"
                )
            ],
            choice=choice,
            rationale=(
                f"Actor {plan_setup.actor.name!r} is a model ({spec.model} at {spec.base_url}): "
                "it decides each "
                "step after the results of the last; each of its tool calls is a decision below."
            ),
        )
        return actor.Strategy([root], [], [root])

    # the loop ------------------------------------------------------------------------

    async def execute(self, run: PlanRun) -> None:
        plan_setup = run.setup
        spec = plan_setup.actor.spec
        functions = self.functions(plan_setup)
        first = list(run.prompt().messages)
        conversation = run.conversation()
        turn_number = sum(1 for e in conversation if e["role"] == "assistant")
        refused_in_a_row = 0
        # A run that paused for an approval goes on with the calls it had not answered.
        await self._run_calls(run, self._unanswered(run, functions, conversation), conversation)
        while True:
            run.check_cancel()
            messages = wire_messages(first, conversation)
            prompt_tokens = estimate(json.dumps(messages)) + estimate(json.dumps(functions.tools))
            max_chars = self._room(run, prompt_tokens)
            turn_number += 1
            try:
                turn = await self.models.stream(
                    plan_setup.actor.name,
                    spec,
                    messages,
                    functions.tools,
                    run.text(turn_number),
                    cancel=run.cancel,
                    max_chars=max_chars,
                    hold=run.hold(turn_number),
                )
            except ModelCancelledError:
                run.check_cancel()
                raise
            except ModelError as failure:
                run.stop(failure.reason, failure.message)
            usage = turn.usage or Usage(
                prompt_tokens, estimate(turn.text + "".join(c.arguments for c in turn.tool_calls))
            )
            await run.charge(
                usage.total / 1000 * spec.cost_per_1k_tokens, usage.total, f"model turn {turn_number}"
            )
            if turn.finish_reason == "length_budget":
                run.stop(
                    ErrorCode.Name(ErrorCode.BUDGET_EXCEEDED),
                    f"model turn {turn_number} was stopped: its answer would cost more than the "
                    f"{run.plan.cost.budget - run.plan.cost.spent:g} left of the budget "
                    f"{run.plan.cost.budget:g}",
                )
            if not turn.tool_calls:
                await self._finish(run, turn, turn_number, conversation)
                return
            refused = await self._calls(run, functions, turn, turn_number, conversation)
            refused_in_a_row = refused_in_a_row + refused if refused == len(turn.tool_calls) else 0
            if refused_in_a_row >= self.models.settings.max_tool_errors:
                run.stop(
                    "model_tool_errors",
                    f"the model made {refused_in_a_row} tool calls in a row that could not run "
                    "(unknown tools or arguments that are not JSON); the last error was sent back to it",
                )

    @staticmethod
    def _room(run: PlanRun, prompt_tokens: int) -> int | None:
        """Characters the next answer may have before it crosses the budget; stops the plan
        when the prompt alone would."""
        rate = run.setup.actor.spec.cost_per_1k_tokens
        budget = run.plan.cost.budget
        if not budget or rate <= 0:
            return None
        left_tokens = (budget - run.plan.cost.spent) / rate * 1000
        if prompt_tokens > left_tokens:
            run.stop(
                ErrorCode.Name(ErrorCode.BUDGET_EXCEEDED),
                f"the next model turn needs about {prompt_tokens} tokens "
                f"({prompt_tokens / 1000 * rate:g}); only {max(budget - run.plan.cost.spent, 0):g} "
                f"of the budget {budget:g} is left",
            )
        return int((left_tokens - prompt_tokens) * CHARS_PER_TOKEN)

    def _node(self, run: PlanRun, nodes: list[plan_pb2.DecisionNode], **fields: Any) -> plan_pb2.DecisionNode:
        current = [n for n in nodes if not n.superseded]
        node = plan_pb2.DecisionNode(
            id=f"d{len(nodes) + 1}", parent_id=current[-1].id if current else "", **fields
        )
        nodes.append(node)
        return node

    async def _finish(
        self, run: PlanRun, turn: Turn, number: int, conversation: list[dict[str, Any]]
    ) -> None:
        nodes = run.nodes()
        node = self._node(
            run,
            nodes,
            question=f"{QUESTION} (turn {number})",
            options=[plan_pb2.DecisionOption(label=FINISH, description="the model's final answer")],
            choice=FINISH,
            rationale=_cut(turn.text, MAX_RATIONALE_CHARS) or "The model ended without a word.",
        )
        entry = {"role": "assistant", "content": turn.text, "node": node.id}
        conversation.append(entry)
        await run.decide([node], [], entry)

    async def _calls(
        self, run: PlanRun, functions: Functions, turn: Turn, number: int, conversation: list[dict[str, Any]]
    ) -> int:
        """Record the turn's calls as decisions (and steps), run them in order, answer each
        to the model. Returns how many were refused."""
        nodes, steps = run.nodes(), run.steps()
        planned: list[tuple[ToolCall, plan_pb2.PlanStep | None, str]] = []
        step: plan_pb2.PlanStep
        labels: list[str] = []
        for call in turn.tool_calls:
            offered = functions.find(call.name)
            try:
                if offered is None:
                    raise CallError(
                        f"there is no tool {call.name!r}; the tools are: {', '.join(functions.names)}"
                    )
                args, reason = arguments(call.arguments)
            except CallError as exc:
                planned.append((call, None, str(exc)))
                labels.append(f"{call.name}({_cut(call.arguments, 40)})")
                continue
            step = plan_pb2.PlanStep(
                id=f"call-{len(steps) + 1}", tool=offered.tool, args=actor.struct(args), state=model.PENDING
            )
            step.description = _cut(reason, 200)
            steps.append(step)
            planned.append((call, step, reason))
            labels.append(actor.call_label(step.tool, step.args))
        options = [plan_pb2.DecisionOption(label=label) for label in dict.fromkeys(labels)]
        new_nodes = []
        for (_, planned_step, said), label in zip(planned, labels, strict=True):
            if planned_step is None:
                rationale = f"Refused: {said}"
            else:
                rationale = said or _cut(turn.text, MAX_RATIONALE_CHARS) or "The model gave no reason."
            node = self._node(
                run,
                nodes,
                question=f"{QUESTION} (turn {number})",
                options=options,
                choice=label,
                rationale=rationale,
            )
            if planned_step is not None:
                node.step_ids.append(planned_step.id)
                planned_step.decision_id = node.id
            new_nodes.append(node)
        entry = {
            "role": "assistant",
            "content": turn.text,
            "tool_calls": [
                {"id": c.id, "function": c.name, "arguments": c.arguments, "node": n.id}
                for c, n in zip(turn.tool_calls, new_nodes, strict=True)
            ],
        }
        conversation.append(entry)
        await run.decide(new_nodes, steps, entry)
        return await self._run_calls(run, [(c.id, st, said) for c, st, said in planned], conversation)

    @staticmethod
    def _unanswered(
        run: PlanRun, functions: Functions, conversation: list[dict[str, Any]]
    ) -> list[tuple[str, plan_pb2.PlanStep | None, str]]:
        """The last answer's calls that have no result yet (the run paused among them), as
        ``_run_calls`` takes them: each with its pending step, or why it was refused."""
        last = next((e for e in reversed(conversation) if e["role"] != "tool"), None)
        if last is None or last["role"] != "assistant" or not last.get("tool_calls"):
            return []
        answered = {e["tool_call_id"] for e in conversation if e["role"] == "tool"}
        by_node = {s.decision_id: s for s in run.steps() if not model.superseded(s)}
        left: list[tuple[str, plan_pb2.PlanStep | None, str]] = []
        for call in last["tool_calls"]:
            if call["id"] in answered:
                continue
            step = by_node.get(call["node"])
            if step is not None:
                if step.state == model.PENDING:
                    left.append((call["id"], step, ""))
                continue
            offered = functions.find(call["function"])
            said = f"there is no tool {call['function']!r}; the tools are: {', '.join(functions.names)}"
            if offered is not None:
                try:
                    arguments(call["arguments"])
                except CallError as exc:
                    said = str(exc)
            left.append((call["id"], None, said))
        return left

    async def _run_calls(
        self,
        run: PlanRun,
        planned: Sequence[tuple[str, plan_pb2.PlanStep | None, str]],
        conversation: list[dict[str, Any]],
    ) -> int:
        """Run the calls in order, answering each to the model; how many were refused."""
        refused = 0
        limit, set_by = run.step_limit()
        for call_id, to_run, said in planned:
            run.check_cancel()
            if to_run is None:
                refused += 1
                answer = json.dumps({"error": {"code": "INVALID_PARAMS", "message": said}})
            else:
                position = (
                    sum(1 for s in run.steps() if not model.superseded(s) and s.state != model.PENDING) + 1
                )
                if position > limit:
                    run.stop(
                        ErrorCode.Name(ErrorCode.BUDGET_EXCEEDED),
                        f"step {to_run.id!r} would be step {position}; {set_by} {limit}",
                    )
                completed = await run.run_step(to_run)
                answer = _answer(completed)
            result = {"role": "tool", "tool_call_id": call_id, "content": answer}
            conversation.append(result)
            await run.remember(result)
        return refused

    # corrections ---------------------------------------------------------------------

    def correct(
        self,
        nodes: Sequence[plan_pb2.DecisionNode],
        steps: Sequence[plan_pb2.PlanStep],
        conversation: Sequence[dict[str, Any]],
        request: plan_pb2.CorrectPlanRequest,
        number: int,
    ) -> tuple[actor.Strategy, plan_pb2.DecisionNode]:
        """Supersede the node and everything after it; the conversation goes back to just
        before that decision, with the correction as the user's next message."""
        if request.overrides:
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                "overrides replace scripted steps; a model plan takes the correction text, "
                "which the model reads when it goes on",
                {"field": "overrides"},
            )
        tree = [_copy(n) for n in nodes]
        plan_steps = [_copy(s) for s in steps]
        current = {n.id: n for n in tree if not n.superseded}
        target = current.get(request.node_id)
        if target is None:
            known = any(n.id == request.node_id for n in tree)
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                f"decision {request.node_id!r} was superseded; correct its replacement"
                if known
                else f"the plan has no decision {request.node_id!r}",
                {"field": "node_id", "node_id": request.node_id},
            )
        branch = {target.id}
        for node in tree:
            if node.parent_id in branch:
                branch.add(node.id)
        for node in tree:
            if node.id in branch:
                node.superseded = True
        discarded = set()
        for step in plan_steps:
            if step.decision_id in branch and not model.superseded(step):
                step.state = model.CANCELLED
                step.error.CopyFrom(
                    common_pb2.ErrorInfo(code=model.SUPERSEDED, message=f"superseded by correction {number}")
                )
                discarded.add(step.id)
        text = request.text or "Reconsider this step."
        node = plan_pb2.DecisionNode(
            id=f"d{len(tree) + 1}",
            parent_id=target.parent_id,
            question=target.question,
            options=[
                *target.options,
                plan_pb2.DecisionOption(label="ask the model again", description="the correction"),
            ],
            choice="ask the model again",
            rationale=f"Corrected by the user: {request.text}" if request.text else "Corrected by the user.",
            correction=request.text,
        )
        tree.append(node)
        strategy = actor.Strategy(tree, plan_steps, [node], discarded)
        strategy.conversation = [
            *_cut_conversation(conversation, branch),
            {"role": "user", "content": f"Correction from the user: {text}", "node": node.id},
        ]
        return strategy, node


def _answer(completed: events_pb2.ToolCompleted) -> str:
    if completed.ok:
        body: dict[str, Any] = actor.as_dict(completed.result)
    else:
        body = {"error": {"code": completed.error.code, "message": completed.error.message}}
        if completed.result.fields:
            body["result"] = actor.as_dict(completed.result)
    return _cut(json.dumps(body, ensure_ascii=False), MAX_RESULT_CHARS)


def _cut_conversation(conversation: Sequence[dict[str, Any]], branch: set[str]) -> list[dict[str, Any]]:
    """The entries before the first decision of ``branch``; an answer whose calls were partly
    before it keeps those calls and their results."""
    kept: list[dict[str, Any]] = []
    kept_calls: set[str] = set()
    closing = False
    for entry in conversation:
        if entry["role"] == "tool":
            if entry["tool_call_id"] in kept_calls:
                kept.append(entry)
            continue
        if closing or entry.get("node") in branch:
            break
        calls = entry.get("tool_calls") or []
        before = list(itertools.takewhile(lambda call: call["node"] not in branch, calls))
        if len(before) < len(calls):
            closing = True
            if not before:
                continue
            entry = {**entry, "tool_calls": before}
        kept.append(entry)
        kept_calls.update(call["id"] for call in before)
    return kept


def _copy(message: Any) -> Any:
    copied = type(message)()
    copied.CopyFrom(message)
    return copied
