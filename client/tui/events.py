"""The live event log: every event the app's listener receives (it resumes after a lost
connection from the last sequence it had, so nothing is missed or shown twice), filtered by
words (type, plan, session, text); ``space`` pauses the view, not the stream."""

from __future__ import annotations

from typing import ClassVar

from google.protobuf import json_format
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.widgets import Input, RichLog, Static

from cleveragents.acp.client.tui.page import Page
from cleveragents.acp.v1 import events_pb2

# Lines the view keeps (the app keeps more events; a filter reads those).
SHOWN = 1000


def summary(event: events_pb2.Event) -> str:
    kind = event.WhichOneof("payload")
    if kind is None:
        return ""
    payload = getattr(event, kind)
    data = json_format.MessageToDict(payload, preserving_proto_field_name=True)
    text = " ".join(f"{key}={value}" for key, value in data.items())
    return text[:300]


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
        body = show.text(summary(event))
        whole = f"{event.type} {event.plan_id} {event.session_id} {ids} {body}".lower()
        if not all(word in whole for word in self.words()):
            return None
        text = Text()
        text.append(f"{show.time(event.time)} ", style="dim")
        text.append(f"#{show.id(str(event.sequence))} ", style="dim")
        text.append(f"{event.type:<24} ", style="bold cyan")
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
            f"{state} · {len(self.acp.events)} events kept · last sequence {self.acp.show.id(str(last))}"
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
