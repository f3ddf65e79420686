"""The built-in ``scripted`` actor: the prompt it is given, the decision tree and steps it
builds from the action's declared steps, and how a correction re-strategizes a branch.

It is deterministic and needs nothing external; it still receives the full prompt
(system, skills, context, action prompt, corrections) so ``plan.prompt`` shows exactly
what an actor of this plan was given, and its usage is charged per prompt token.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf import json_format, struct_pb2

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.plans import model, paths, templates
from cleveragents.acp.facade.domain.plans.setup import PlanSetup
from cleveragents.acp.v1 import common_pb2, plan_pb2, specs_pb2

# Files listed per resource in the prompt's context.
CONTEXT_FILES = 200
# The entries a prompt's context walks at most (folders and files): the count after the
# listed files stops there (two realpath calls a file; a huge project must not cost each
# plan seconds of a worker thread).
CONTEXT_WALK_FILES = 10_000
_ARG_PREVIEW = 40
_M = TypeVar("_M", plan_pb2.DecisionNode, plan_pb2.PlanStep)


def struct(value: Mapping[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(dict(value))
    return out


def as_dict(value: struct_pb2.Struct) -> dict[str, Any]:
    return json_format.MessageToDict(value)


def estimate_tokens(text: str) -> int:
    """A provider-independent estimate: about four characters per token."""
    return math.ceil(len(text) / 4)


# prompt ---------------------------------------------------------------------------------


def _context(setup: PlanSetup, inputs: Mapping[str, Any]) -> str:
    lines = [
        f"Project: {setup.project.name}"
        + (f" ({setup.project.description})" if setup.project.description else "")
    ]
    for root in setup.resources.values():
        flag = ", read-only" if root.read_only else ""
        lines.append(f"Resource {root.name}: directory {root.root}{flag}")
        try:
            files, more = paths.first_files(root.root, CONTEXT_WALK_FILES, anchor=root.place)
        except ACPError:
            files, more = [], False
        for path in files[:CONTEXT_FILES]:
            lines.append(f"  {path}")
        if more:
            lines.append(f"  ... and more files (the walk stopped after {CONTEXT_WALK_FILES} entries)")
        elif len(files) > CONTEXT_FILES:
            lines.append(f"  ... and {len(files) - CONTEXT_FILES} more files")
    lines.append("Inputs: " + json.dumps(dict(inputs), sort_keys=True))
    return "\n".join(lines)


def task(setup: PlanSetup, inputs: Mapping[str, Any]) -> str:
    """The action's prompt template filled in: INVALID_PARAMS when an input it names is missing.
    Without the context, so it reads no folder: ``plan.use`` checks it on the event loop."""
    try:
        return templates.render_text(setup.action.spec.prompt_template, inputs)
    except templates.TemplateError as exc:
        raise ACPError(
            ErrorCode.INVALID_PARAMS, f"prompt_template: {exc}", {"field": "inputs", "placeholder": exc.name}
        ) from None


def prompt(
    setup: PlanSetup, inputs: Mapping[str, Any], corrections: Sequence[str]
) -> plan_pb2.GetPlanPromptResponse:
    action_prompt = task(setup, inputs)
    skills = [f"{name}: {text}" for name, text in setup.skills]
    context = _context(setup, inputs)
    sections = briefing(setup, context)
    if action_prompt:
        sections.append(f"# Task\n{action_prompt}")
    if corrections:
        sections.append(
            "# Corrections\n" + "\n".join(f"{i}. {text}" for i, text in enumerate(corrections, 1))
        )
    return plan_pb2.GetPlanPromptResponse(
        system=setup.actor.spec.system_prompt,
        skills=skills,
        context=context,
        action_prompt=action_prompt,
        corrections=list(corrections),
        full_text="\n\n".join(sections) + "\n",
    )


def briefing(setup: PlanSetup, context: str) -> list[str]:
    """The prompt's sections before the task: the actor's system prompt, skills, context."""
    sections: list[str] = []
    if setup.actor.spec.system_prompt:
        sections.append(f"# System\n{setup.actor.spec.system_prompt}")
    if setup.skills:
        sections.append("# Skills\n" + "\n\n".join(f"## {name}\n{text}" for name, text in setup.skills))
    sections.append(f"# Context\n{context}")
    return sections


def usage_cost(setup: PlanSetup, given: plan_pb2.GetPlanPromptResponse) -> float:
    return estimate_tokens(given.full_text) / 1000 * setup.actor.spec.cost_per_1k_tokens


# steps ----------------------------------------------------------------------------------


def declared_steps(action_spec: specs_pb2.ActionSpec, inputs: Mapping[str, Any]) -> list[plan_pb2.PlanStep]:
    """The action's steps with their arguments rendered from the inputs; an unknown
    placeholder is INVALID_PARAMS naming the step."""
    steps: list[plan_pb2.PlanStep] = []
    seen: set[str] = set()
    for index, declared in enumerate(action_spec.steps):
        step_id = declared.id or f"step-{index + 1}"
        if step_id in seen:
            step_id = f"{step_id}-{index + 1}"
        seen.add(step_id)
        try:
            args = templates.render(as_dict(declared.args), inputs)
        except templates.TemplateError as exc:
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                f"step {step_id!r}: {exc}; the inputs have no such value",
                {"field": "inputs", "step": step_id, "placeholder": exc.name},
            ) from None
        steps.append(
            plan_pb2.PlanStep(
                id=step_id,
                tool=declared.tool,
                args=struct(args),
                description=declared.description,
                state=model.PENDING,
            )
        )
    return steps


def call_label(tool: str, args: struct_pb2.Struct) -> str:
    shown = []
    for key, value in sorted(as_dict(args).items()):
        text = templates.as_text(value)
        if len(text) > _ARG_PREVIEW:
            text = text[: _ARG_PREVIEW - 3] + "..."
        shown.append(f"{key}={text!r}" if isinstance(value, str) else f"{key}={text}")
    return f"{tool}({', '.join(shown)})"


# the tree -------------------------------------------------------------------------------


@dataclass
class Strategy:
    """A tree and step list after strategizing (or re-strategizing a branch)."""

    nodes: list[plan_pb2.DecisionNode]
    steps: list[plan_pb2.PlanStep]
    # Nodes added by this strategizing, in the order their events go out.
    new_nodes: list[plan_pb2.DecisionNode] = field(default_factory=list)
    # Steps whose staged changes no longer count (superseded or to run again).
    discarded: set[str] = field(default_factory=set)
    # A model actor's conversation as it is to be stored from now on (None: unchanged).
    conversation: list[dict[str, Any]] | None = None


def _node_id(nodes: Sequence[plan_pb2.DecisionNode]) -> str:
    return f"d{len(nodes) + 1}"


def _step_node(
    nodes: list[plan_pb2.DecisionNode],
    parent: str,
    step: plan_pb2.PlanStep,
    action: str,
    *,
    replaced: plan_pb2.PlanStep | None = None,
    correction: str = "",
) -> plan_pb2.DecisionNode:
    label = call_label(step.tool, step.args)
    options = [plan_pb2.DecisionOption(label=label, description=step.description)]
    if replaced is not None and call_label(replaced.tool, replaced.args) != label:
        options.insert(
            0,
            plan_pb2.DecisionOption(
                label=call_label(replaced.tool, replaced.args), description="as declared"
            ),
        )
    if correction or replaced is not None:
        rationale = f"Corrected by the user: {correction}" if correction else "Corrected by the user."
    else:
        rationale = f"Declared by action {action!r}" + (f": {step.description}" if step.description else ".")
    node = plan_pb2.DecisionNode(
        id=_node_id(nodes),
        parent_id=parent,
        question=f"What should step {step.id.split('~')[0]!r} do?",
        options=options,
        choice=label,
        rationale=rationale,
        correction=correction,
        step_ids=[step.id],
    )
    nodes.append(node)
    step.decision_id = node.id
    return node


def _root(
    nodes: list[plan_pb2.DecisionNode], action: str, project: str, count: int, correction: str
) -> plan_pb2.DecisionNode:
    choice = "run the declared steps"
    node = plan_pb2.DecisionNode(
        id=_node_id(nodes),
        question=f"How should action {action!r} be carried out on project {project!r}?",
        options=[
            plan_pb2.DecisionOption(
                label=choice, description=f"run the {count} steps the action declares, in order"
            )
        ],
        choice=choice,
        rationale=(
            "The scripted actor is deterministic: it runs the steps its action declares, "
            "their arguments filled from the plan inputs."
            + (f" Corrected by the user: {correction}" if correction else "")
        ),
        correction=correction,
    )
    nodes.append(node)
    return node


def strategize(setup: PlanSetup, plan: plan_pb2.Plan, inputs: Mapping[str, Any]) -> Strategy:
    steps = declared_steps(setup.action.spec, inputs)
    nodes: list[plan_pb2.DecisionNode] = []
    root = _root(nodes, plan.action, plan.project, len(steps), "")
    for step in steps:
        _step_node(nodes, root.id, step, plan.action)
    return Strategy(nodes, steps, list(nodes))


def _base(step_id: str) -> str:
    return step_id.split("~", 1)[0]


def correct(
    nodes: Sequence[plan_pb2.DecisionNode],
    steps: Sequence[plan_pb2.PlanStep],
    request: plan_pb2.CorrectPlanRequest,
    number: int,
    action: str,
    project: str,
) -> tuple[Strategy, plan_pb2.DecisionNode]:
    """Supersede the branch at ``request.node_id`` and strategize it again with the
    correction: overrides replace (or drop) its steps; its steps, and every later step,
    run again. Returns the new strategy and the branch's new node."""
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
    grew = True
    while grew:
        grew = False
        for node in current.values():
            if node.parent_id in branch and node.id not in branch:
                branch.add(node.id)
                grew = True
    branch_steps = [s for s in plan_steps if s.decision_id in branch and not model.superseded(s)]
    overrides: dict[str, plan_pb2.StepOverride] = {}
    for index, override in enumerate(request.overrides):
        match = next((s for s in branch_steps if override.step_id in (s.id, _base(s.id))), None)
        if match is None:
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                f"override {index}: step {override.step_id!r} is not a step of decision {target.id!r}",
                {"field": f"overrides[{index}].step_id", "step_id": override.step_id},
            )
        overrides[match.id] = override
    for node in tree:
        if node.id in branch:
            node.superseded = True
    replacements: list[tuple[plan_pb2.PlanStep, plan_pb2.PlanStep]] = []
    for old in branch_steps:
        old.state = model.CANCELLED
        old.error.CopyFrom(
            common_pb2.ErrorInfo(code=model.SUPERSEDED, message=f"superseded by correction {number}")
        )
        given = overrides.get(old.id)
        if given is not None and given.remove:
            continue
        new = plan_pb2.PlanStep(
            id=f"{_base(old.id)}~{number}",
            tool=given.tool if given is not None and given.tool else old.tool,
            description=old.description,
            state=model.PENDING,
        )
        new.args.CopyFrom(given.args if given is not None and given.HasField("args") else old.args)
        replacements.append((old, new))
    before = len(tree)
    if not target.parent_id:
        new_node = _root(tree, action, project, len(replacements), request.text)
        for old, new in replacements:
            _step_node(
                tree,
                new_node.id,
                new,
                action,
                replaced=old if old.id in overrides else None,
                correction=request.text,
            )
    else:
        new_node = plan_pb2.DecisionNode(
            id=_node_id(tree),
            parent_id=target.parent_id,
            question=target.question,
            options=list(target.options),
            choice=", ".join(call_label(n.tool, n.args) for _, n in replacements) or "skip this step",
            rationale=f"Corrected by the user: {request.text}" if request.text else "Corrected by the user.",
            correction=request.text,
            step_ids=[n.id for _, n in replacements],
        )
        labels = {o.label for o in new_node.options}
        if new_node.choice not in labels:
            new_node.options.append(
                plan_pb2.DecisionOption(label=new_node.choice, description="the correction")
            )
        tree.append(new_node)
        for _, new in replacements:
            new.decision_id = new_node.id
    # New steps go right after the last step they replace; that step and all after it
    # run again, so their staged changes are discarded.
    discarded = {s.id for s in branch_steps}
    if branch_steps:
        position = plan_steps.index(branch_steps[-1]) + 1
        plan_steps[position:position] = [new for _, new in replacements]
        first = plan_steps.index(branch_steps[0])
        for step in plan_steps[first:]:
            if not model.superseded(step) and step.state != model.PENDING:
                discarded.add(step.id)
                step.state = model.PENDING
                step.ClearField("error")
                step.duration_ms = 0
    return Strategy(tree, plan_steps, tree[before:], discarded), new_node


def _copy(message: _M) -> _M:
    copied = type(message)()
    copied.CopyFrom(message)
    return copied
