"""Human-readable rendering of responses: tables for lists, a tree for decision trees,
coloured unified diffs, plain text for prose, and YAML for everything else.

Renderers are chosen by the response's message type and shape, never by operation name,
so a new operation renders sensibly with no code here.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from typing import Any, TextIO, cast

import yaml
from google.protobuf import descriptor, message

from cleveragents.acp.client.cli.fields import enum_choices, enum_prefix, is_map
from cleveragents.acp.contract import codec
from cleveragents.acp.contract.catalog import BUILTIN_LABEL
from cleveragents.acp.v1 import approval_pb2, events_pb2, plan_pb2, session_pb2

FD = descriptor.FieldDescriptor
_RED, _GREEN, _CYAN, _BOLD, _DIM, _RESET = "\x1b[31m", "\x1b[32m", "\x1b[36m", "\x1b[1m", "\x1b[2m", "\x1b[0m"


class Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, code: str, text: str) -> str:
        return f"{code}{text}{_RESET}" if self.color else text


def short_enum(field: descriptor.FieldDescriptor, number: int) -> str:
    assert field.enum_type is not None
    value = field.enum_type.values_by_number.get(number)
    if value is None or value.number == 0:
        return ""
    return enum_choices(field.enum_type)[
        [v.number for v in field.enum_type.values if v.number != 0].index(number)
    ]


def _cell(msg: message.Message, field: descriptor.FieldDescriptor) -> str:
    value = getattr(msg, field.name)
    if field.enum_type is not None:
        return short_enum(field, value)
    if field.type == FD.TYPE_BOOL:
        return "yes" if value else ""
    text = str(value).replace("\n", " ")
    return text if len(text) <= 48 else text[:45] + "..."


def _field_cell(field: descriptor.FieldDescriptor) -> Callable[[Any], str]:
    return lambda msg: _cell(msg, field)


def _columns(item: descriptor.Descriptor) -> list[tuple[str, Callable[[Any], str]]]:
    columns: list[tuple[str, Callable[[Any], str]]] = []
    fields = item.fields_by_name
    if "name" not in fields and "meta" in fields:
        columns.append(("id", lambda m: m.meta.id))
    for field in item.fields:
        if field.is_repeated or field.message_type is not None:
            continue
        columns.append((field.name, _field_cell(field)))
    if "meta" in fields:
        columns.insert(1 if "name" not in fields else 0, ("namespace", lambda m: m.meta.namespace))
    if "progress" in fields:
        columns.append(("progress", lambda m: f"{m.progress.done}/{m.progress.total}"))
    if "labels" in fields:
        # Entries every namespace has, marked (a table shows no other labels).
        columns.append((BUILTIN_LABEL, lambda m: "yes" if m.labels.get(BUILTIN_LABEL) == "true" else ""))
    return columns


_JSON_VALUES = frozenset({"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"})
_EXACT = 2**53


def _whole(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < _EXACT:
        return int(value)
    if isinstance(value, dict):
        return {key: _whole(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole(item) for item in value]
    return value


def _whole_numbers(data: dict[str, Any], desc: descriptor.Descriptor) -> dict[str, Any]:
    for field in desc.fields:
        nested = field.message_type
        if nested is None or field.name not in data:
            continue
        value = data[field.name]
        if nested.full_name in _JSON_VALUES:
            data[field.name] = _whole(value)
        elif is_map(field):
            inner = nested.fields_by_name["value"].message_type
            if inner is not None and inner.full_name in _JSON_VALUES:
                data[field.name] = _whole(value)
            elif inner is not None:
                data[field.name] = {k: _whole_numbers(v, inner) for k, v in value.items()}
        elif not nested.full_name.startswith("google.protobuf."):
            if field.is_repeated:
                data[field.name] = [_whole_numbers(item, nested) for item in value]
            else:
                data[field.name] = _whole_numbers(value, nested)
    return data


def data(msg: message.Message) -> dict[str, Any]:
    """The message's proto JSON, with the whole numbers of its JSON values (``Struct``,
    ``Value``) as integers: a Struct holds every number as a double, which Python prints
    ``2.0`` (an export's ``"message_count": 2.0``, a plan's ``"level": 2.0``)."""
    return _whole_numbers(codec.to_dict(msg), cast(descriptor.Descriptor, msg.DESCRIPTOR))


def table(items: list[message.Message], item_type: descriptor.Descriptor, out: TextIO, style: Style) -> None:
    columns = _columns(item_type)
    rows = [[render_cell(m) for _, render_cell in columns] for m in items]
    headers = [name.upper() for name, _ in columns]
    keep = [i for i in range(len(headers)) if any(row[i] for row in rows)] or list(range(len(headers)))
    widths = [max([len(headers[i])] + [len(row[i]) for row in rows]) for i in keep]
    out.write(
        style(_BOLD, "  ".join(headers[i].ljust(w) for i, w in zip(keep, widths, strict=True)).rstrip())
        + "\n"
    )
    for row in rows:
        out.write("  ".join(row[i].ljust(w) for i, w in zip(keep, widths, strict=True)).rstrip() + "\n")


def _list_shape(response: message.Message) -> Any:
    """The one repeated message field of a list response (plus its page token), if any."""
    fields: list[Any] = list(response.DESCRIPTOR.fields)
    repeated = [f for f in fields if f.is_repeated and f.message_type is not None]
    others = [f for f in fields if f not in repeated and f.name != "next_page_token"]
    if len(repeated) == 1 and not others:
        item_type = repeated[0].message_type
        if item_type is not None and not item_type.GetOptions().map_entry:
            return repeated[0]
    return None


def tree(response: plan_pb2.GetPlanTreeResponse, out: TextIO, style: Style) -> None:
    children: dict[str, list[plan_pb2.DecisionNode]] = {}
    for node in response.nodes:
        children.setdefault(node.parent_id, []).append(node)
    steps = {step.id: step for step in response.steps}

    def walk(parent: str, indent: str) -> None:
        nodes = children.get(parent, [])
        for i, node in enumerate(nodes):
            last = i == len(nodes) - 1
            branch = "└─ " if last else "├─ "
            mark = style(_DIM, " (superseded)") if node.superseded else ""
            # The id is what `plan correct PLAN_ID NODE_ID` takes.
            node_id = style(_DIM, f" [{node.id}]")
            out.write(f"{indent}{branch}{style(_BOLD, node.question)} -> {node.choice}{mark}{node_id}\n")
            deeper = indent + ("   " if last else "│  ")
            if node.rationale:
                out.write(f"{deeper}{style(_DIM, node.rationale)}\n")
            for step_id in node.step_ids:
                step = steps.get(step_id)
                if step is not None:
                    state = short_enum(plan_pb2.PlanStep.DESCRIPTOR.fields_by_name["state"], step.state)
                    out.write(f"{deeper}• {step.id} {step.tool} [{state}]\n")
            walk(node.id, deeper)

    walk("", "")


def diff(response: plan_pb2.GetPlanDiffResponse, out: TextIO, style: Style) -> None:
    for file in response.files:
        for line in file.unified_diff.splitlines():
            if line.startswith(("+++", "---")):
                out.write(style(_BOLD, line) + "\n")
            elif line.startswith("+"):
                out.write(style(_GREEN, line) + "\n")
            elif line.startswith("-"):
                out.write(style(_RED, line) + "\n")
            elif line.startswith("@@"):
                out.write(style(_CYAN, line) + "\n")
            else:
                out.write(line + "\n")


def replies(response: session_pb2.TellSessionResponse, out: TextIO, style: Style) -> None:
    for reply in response.replies:
        out.write(reply.content.rstrip("\n") + "\n")


def readable(data: Any, desc: descriptor.Descriptor) -> dict[str, Any]:
    """Proto JSON for people: empty values left out, enum values without their prefix."""
    result: dict[str, Any] = {}
    for field in desc.fields:
        value = data.get(field.name)
        if value is None or value == "" or value == [] or value == {}:
            continue
        nested = field.message_type
        if nested is not None and not is_map(field) and not nested.full_name.startswith("google.protobuf."):
            value = [readable(v, nested) for v in value] if field.is_repeated else readable(value, nested)
        elif field.enum_type is not None:
            prefix = enum_prefix(field.enum_type)

            def short(name: Any, prefix: str = prefix) -> Any:
                return name.removeprefix(prefix).lower() if isinstance(name, str) else name

            value = [short(v) for v in value] if field.is_repeated else short(value)
        result[field.name] = value
    return result


class _Dumper(yaml.SafeDumper):
    """Text with line breaks as a literal block (``|``), as written, instead of a quoted
    scalar folded over several lines (``'Hello!\n\n  '``)."""


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value and value.strip() and not value[0].isspace() else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def _yaml(data: Any, out: TextIO) -> None:
    out.write(
        yaml.dump(
            data,
            Dumper=_Dumper,
            sort_keys=False,
            allow_unicode=True,
            width=shutil.get_terminal_size().columns,
        )
    )


def explanation(response: plan_pb2.ExplainPlanResponse, out: TextIO, style: Style) -> None:
    out.write(response.text.rstrip("\n") + "\n")


def prompt(response: plan_pb2.GetPlanPromptResponse, out: TextIO, style: Style) -> None:
    out.write(response.full_text.rstrip("\n") + "\n")


_BY_TYPE: dict[str, Callable[[Any, TextIO, Style], None]] = {
    plan_pb2.GetPlanTreeResponse.DESCRIPTOR.full_name: tree,
    plan_pb2.GetPlanDiffResponse.DESCRIPTOR.full_name: diff,
    session_pb2.TellSessionResponse.DESCRIPTOR.full_name: replies,
    plan_pb2.ExplainPlanResponse.DESCRIPTOR.full_name: explanation,
    plan_pb2.GetPlanPromptResponse.DESCRIPTOR.full_name: prompt,
}


def human(response: message.Message, out: TextIO, *, color: bool) -> None:
    style = Style(color)
    renderer = _BY_TYPE.get(response.DESCRIPTOR.full_name)
    if renderer is not None:
        renderer(response, out, style)
        return
    list_field = _list_shape(response)
    if list_field is not None:
        items = list(getattr(response, list_field.name))
        if not items:
            out.write(style(_DIM, f"no {list_field.name}") + "\n")
        else:
            table(items, list_field.message_type, out, style)
        token = getattr(response, "next_page_token", "")
        if token:
            out.write(style(_DIM, f"more: --page-token {token}") + "\n")
        return
    _yaml(readable(data(response), cast(descriptor.Descriptor, response.DESCRIPTOR)), out)


def _phase(number: int) -> str:
    return short_enum(events_pb2.PlanStateChanged.DESCRIPTOR.fields_by_name["phase"], number)


def _state(number: int) -> str:
    return short_enum(events_pb2.PlanStateChanged.DESCRIPTOR.fields_by_name["to_state"], number)


def _turn_state(number: int) -> str:
    return short_enum(session_pb2.Turn.DESCRIPTOR.fields_by_name["state"], number)


def detail(event: events_pb2.Event) -> str:
    """What an event says beyond its type, in a few words, for one line of ``events watch``
    or progress."""
    kind = event.WhichOneof("payload")
    text = ""
    if kind == "tool_invoked":
        text = f"{event.tool_invoked.tool} ({event.tool_invoked.step_id})"
    elif kind == "tool_completed":
        done = event.tool_completed
        result = "ok" if done.ok else f"error: {done.error.message}"
        text = f"{done.tool} {result} in {done.duration_ms:.0f} ms"
    elif kind == "plan_state_changed":
        change = event.plan_state_changed
        text = f"{_phase(change.phase)}: {_state(change.from_state) or '-'} -> {_state(change.to_state)}"
    elif kind == "plan_phase_changed":
        text = f"-> {_phase(event.plan_phase_changed.to_phase)}"
    elif kind == "validation_completed":
        check = event.validation_completed
        text = f"{check.validation} {'passed' if check.passed else 'failed: ' + '; '.join(check.messages)}"
    elif kind == "plan_decision_made":
        text = f"{event.plan_decision_made.node.question} -> {event.plan_decision_made.node.choice}"
    elif kind == "session_message":
        content = event.session_message.message.content
        text = content.splitlines()[0] if content else ""
    elif kind == "plan_error":
        text = f"{event.plan_error.error.code}: {event.plan_error.error.message}"
    elif kind in ("session_turn_started", "session_turn_completed"):
        turn: session_pb2.Turn = getattr(event, kind).turn
        text = f"turn {turn.id} {_turn_state(turn.state)}"
        if turn.error.message:
            text += f": {turn.error.message}"
    elif kind == "session_updated":
        text = ", ".join(event.session_updated.fields)
    elif kind == "webhook_disabled":
        text = f"{event.webhook_disabled.name}: {event.webhook_disabled.reason}"
    elif kind in ("approval_requested", "approval_decided", "approval_expired"):
        approval: approval_pb2.Approval = getattr(event, kind).approval
        text = f"{approval.id} {_asks(approval)}"
        if approval.answered_by:
            text += f": {_answer(approval.answer)} by {approval.answered_by}"
        elif approval.state == approval_pb2.APPROVAL_STATE_VOID:
            text += f": void ({approval.reason})"
    elif kind in ("session_text_delta", "plan_text_delta"):
        delta: events_pb2.TextDelta = getattr(event, kind)
        # Quoted, escapes shown: a piece is often a space or a line break.
        text = f"{delta.actor} turn {delta.turn}: {json.dumps(delta.text, ensure_ascii=False)}"
    return text


def _answer(answer: approval_pb2.ApprovalAnswer.ValueType) -> str:
    return approval_pb2.ApprovalAnswer.Name(answer).removeprefix("APPROVAL_ANSWER_").lower()


def _asks(approval: approval_pb2.Approval) -> str:
    """What a request asks about, in a few words."""
    if approval.kind == "apply":
        return "apply the staged diff"
    if approval.command:
        return f"step {approval.step_id}: run {' '.join(approval.command)}"
    args = json.dumps(codec.to_dict(approval)["args"] if approval.args.fields else {}, ensure_ascii=False)
    return f"step {approval.step_id}: {approval.tool} {args}"


# At most this much of an apply's diff is printed with its question.
DIFF_LINES = 40


def approval_question(approval: approval_pb2.Approval) -> str:
    """A pending approval request as ``plan execute --wait`` prints it: the question, what
    exactly would happen, and the command that answers it."""
    lines = [f"agents: plan {approval.plan_id} awaits approval {approval.id} ({approval.rule})"]
    lines.append(f"  {_asks(approval)}")
    if approval.diff:
        shown = approval.diff.splitlines()
        lines.extend(f"  | {line}" for line in shown[:DIFF_LINES])
        if len(shown) > DIFF_LINES:
            lines.append(f"  | ... {len(shown) - DIFF_LINES} more lines (agents approval show {approval.id})")
    lines.append(f"  digest {approval.digest}")
    if approval.HasField("expire_time"):
        lines.append(f"  expires {approval.expire_time.ToJsonString()} (then: {approval.fallback})")
    lines.append(
        f"  answer: agents approval answer {approval.id} --answer allow_once"
        " (or allow_always, reject_once, reject_always; --reason TEXT)"
    )
    return "\n".join(lines) + "\n"


# ``events watch`` columns: every one but the last has a fixed width, so lines stay aligned
# as they stream. Types come from the Event payloads (``plan_state_changed`` ->
# ``plan.state_changed``); plan and session ids are ULIDs ("-": none).
TYPE_WIDTH = max(len(f.name) for f in events_pb2.Event.DESCRIPTOR.oneofs_by_name["payload"].fields)
ID_WIDTH = 26
SEQUENCE_WIDTH = 6


def event_header() -> str:
    columns = ["SEQ".rjust(SEQUENCE_WIDTH), "TYPE".ljust(TYPE_WIDTH), "PLAN".ljust(ID_WIDTH)]
    return "  ".join([*columns, "SESSION".ljust(ID_WIDTH), "DETAIL"])


def event_line(event: events_pb2.Event) -> str:
    columns = [
        str(event.sequence).rjust(SEQUENCE_WIDTH),
        event.type.ljust(TYPE_WIDTH),
        (event.plan_id or "-").ljust(ID_WIDTH),
        (event.session_id or "-").ljust(ID_WIDTH),
        detail(event),
    ]
    return "  ".join(columns).rstrip()


def progress_line(event: events_pb2.Event) -> str:
    """A line of one plan's live progress: its events without the ids."""
    columns = [str(event.sequence).rjust(SEQUENCE_WIDTH), event.type.ljust(TYPE_WIDTH), detail(event)]
    return "  ".join(columns).rstrip()
