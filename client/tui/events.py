"""The live event log: every event the app's listener receives (it resumes after a lost
connection from the last sequence it had, so nothing is missed or shown twice), filtered by
words (type, plan, session, text); ``space`` pauses the view, not the stream."""

from __future__ import annotations

import json
from typing import ClassVar

from google.protobuf import json_format
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Input, RichLog, Static

from cleveragents.acp.client.tui.display import Display, enum
from cleveragents.acp.client.tui.page import Page
from cleveragents.acp.v1 import events_pb2, plan_pb2, session_pb2

# Lines the view keeps (the app keeps more events; a filter reads those).
SHOWN = 1000


def summary(event: events_pb2.Event, show: Display) -> str:
    """One line of what the event says, its ids as the display shows them."""
    kind = event.WhichOneof("payload")
    if kind == "session_message":
        item = event.session_message.message
        return f"{enum(session_pb2.MessageRole, item.role)}: {show.text(item.content)}"
    if kind in ("session_turn_started", "session_turn_completed"):
        turn = getattr(event, kind).turn
        why = f" ({show.text(turn.error.message)})" if turn.error.message else ""
        return f"turn {show.id(turn.id)} {enum(session_pb2.TurnState, turn.state)}{why}"
    if kind in ("session_text_delta", "plan_text_delta"):
        return repr(getattr(event, kind).text)
    if kind == "plan_state_changed":
        change = event.plan_state_changed
        phase = enum(plan_pb2.PlanPhase, change.phase)
        before, after = enum(plan_pb2.PlanState, change.from_state), enum(plan_pb2.PlanState, change.to_state)
        return f"{phase}: {before} -> {after} {show.text(change.reason)}".rstrip()
    if kind == "plan_decision_made":
        node = event.plan_decision_made.node
        return f"{show.text(node.question)} -> {show.text(node.choice)}"
    if kind in ("tool_invoked", "tool_completed"):
        step = getattr(event, kind)
        ok = (
            ""
            if kind == "tool_invoked"
            else (" ok" if step.ok else f" failed: {show.text(step.error.message)}")
        )
        return f"{step.step_id} {step.tool}{ok}"
    if kind is None:
        return ""
    data = json_format.MessageToDict(getattr(event, kind), preserving_proto_field_name=True)
    return show.text(json.dumps(data, separators=(",", ":"), sort_keys=True))


class EventsScreen(Page):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "Filter"),
        Binding("escape", "to_log", "To the log", show=False),
        Binding("space", "pause", "Pause"),
        Binding("y", "copy", "Copy last seq"),
    ]
    DEFAULT_CSS = """
    #log { height: 1fr; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.paused = False

    def body(self) -> ComposeResult:
        yield Input(
            placeholder="/ filter: words all found in an event (type, plan or session id, text)", id="filter"
        )
        yield RichLog(id="log", max_lines=SHOWN, wrap=False, min_width=40)
        yield Static("", id="status", classes="status")

    def on_mount(self) -> None:
        self.query_one("#log", RichLog).focus()
        self.render_all()

    def words(self) -> list[str]:
        return self.query_one("#filter", Input).value.lower().split()

    def line(self, event: events_pb2.Event) -> Text | None:
        show = self.acp.show
        ids = " ".join(
            part
            for part in (
                f"plan {show.id(event.plan_id)}" if event.plan_id else "",
                f"session {show.id(event.session_id)}" if event.session_id else "",
            )
            if part
        )
        body = summary(event, show)[:300]
        whole = f"{event.type} {event.plan_id} {event.session_id} {ids} {body}".lower()
        if not all(word in whole for word in self.words()):
            return None
        text = Text()
        text.append(f"{show.time(event.time)} ", style="dim")
        text.append(f"#{event.sequence} ", style="dim")
        text.append(f"{event.type} ", style="bold cyan")
        text.append(f"{ids} {body}".strip())
        return text

    def render_all(self) -> None:
        log = self.query_one("#log", RichLog)
        log.clear()
        lines = [line for event in self.acp.events if (line := self.line(event)) is not None]
        for line in lines[-SHOWN:]:
            log.write(line)
        self.show_status()

    def show_status(self) -> None:
        listener = self.acp.listener
        last = listener.last_sequence if listener is not None else 0
        state = "paused · space resumes" if self.paused else "live"
        self.query_one("#status", Static).update(
            f"{state} · {len(self.acp.events)} events kept · last sequence {last}"
        )

    def on_acp_event(self, event: events_pb2.Event) -> None:
        if self.paused or not self.is_mounted:
            return
        line = self.line(event)
        if line is not None:
            self.query_one("#log", RichLog).write(line)
        self.show_status()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.render_all()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one("#log", RichLog).focus()

    def action_filter(self) -> None:
        self.query_one("#filter", Input).focus()

    def action_to_log(self) -> None:
        self.query_one("#log", RichLog).focus()

    def action_pause(self) -> None:
        self.paused = not self.paused
        if not self.paused:
            self.render_all()
        self.show_status()

    def action_copy(self) -> None:
        listener = self.acp.listener
        self.acp.copy_id(str(listener.last_sequence) if listener else "", "sequence")
