"""The approvals inbox (issue 38): what waits for a person, with what would happen shown (the
diff in colour for an apply, the tool and its arguments or the command line for a step), and
the four answers, each after a confirmation. The count of pending requests is in the header of
every screen, kept by the app's one listener (``Pending``); the inbox reads ``approval.list``
again when an ``approval.*`` event arrives, so another client's answer shows within a moment.
An answer is sent with the request's digest: the first answer wins, and one that came second is
told who decided first (``APPROVAL_DECIDED``) or what replaced the request (``APPROVAL_VOID``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ClassVar

from google.protobuf import json_format, message
from rich.console import Group, RenderableType
from rich.syntax import Syntax
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Input, Static

from cleveragents.acp.client.tui.display import Display, enum
from cleveragents.acp.client.tui.listing import Listing
from cleveragents.acp.client.tui.modals import Confirm
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import approval_pb2, events_pb2

PENDING = approval_pb2.APPROVAL_STATE_PENDING
PAYLOADS = ("approval_requested", "approval_decided", "approval_expired")
# Pending requests counted at most (pages of 500); more reads "5000+".
MAX_COUNTED = 5000
ANSWERS = {
    "allow_once": "Allow once: run what this request asks, this time",
    "allow_always": "Allow always: this and, for the rest of this plan, every later one of the same tool",
    "reject_once": "Reject once: do not run it (a scripted plan fails, a model is told)",
    "reject_always": "Reject always: this and, for the rest of this plan, every later one of the same tool",
}


def count_text(count: int) -> str:
    if not count:
        return "no approvals pending"
    shown = f"{MAX_COUNTED}+" if count > MAX_COUNTED else str(count)
    return f"{shown} approval{'s' if count != 1 else ''} pending (i)"


class Pending:
    """The ids of the pending requests: read with ``approval.list``, then kept by the events."""

    def __init__(self) -> None:
        self.ids: set[str] = set()

    async def read(self, call: Callable[..., Awaitable[message.Message | None]]) -> int | None:
        found: set[str] = set()
        token = ""
        while len(found) <= MAX_COUNTED:
            page = await call("approval.list", state=PENDING, page_size=500, page_token=token)
            if not isinstance(page, approval_pb2.ListApprovalsResponse):
                return None
            found |= {item.id for item in page.approvals}
            token = page.next_page_token
            if not token:
                break
        self.ids = found
        return len(found)

    def follow(self, event: events_pb2.Event) -> int:
        kind = event.WhichOneof("payload")
        if kind in PAYLOADS:
            approval = getattr(event, kind).approval
            if approval.state == PENDING:
                self.ids.add(approval.id)
            else:
                self.ids.discard(approval.id)
        return len(self.ids)


def what(item: approval_pb2.Approval) -> str:
    """One line: the apply, the command line, or the tool."""
    if item.kind == "apply":
        return "apply the plan's diff"
    if item.command:
        return " ".join(item.command)
    return item.tool


def details(item: approval_pb2.Approval, show: Display) -> RenderableType:
    """Everything the request says, and what would happen (coloured diff, arguments, argv)."""
    head = Text()
    head.append(f"{item.kind} ", style="bold")
    head.append(what(item), style="bold cyan")
    lines = [
        f"request   {show.id(item.id)} · {enum(approval_pb2.ApprovalState, item.state)}",
        f"plan      {show.id(item.plan_id)}"
        + (f" · session {show.id(item.session_id)}" if item.session_id else ""),
        f"asked by  {item.rule}" + (f" · step {item.step_id}" if item.step_id else ""),
        f"asked at  {show.time(item.create_time)} · expires {show.time(item.expire_time)}"
        + (f" (then {item.fallback})" if item.fallback and item.expire_time.seconds else ""),
        f"who may   {', '.join(item.answerable_by) or '-'}",
        f"digest    {item.digest}",
    ]
    if item.state != PENDING:
        answer = enum(approval_pb2.ApprovalAnswer, item.answer) if item.answer else "-"
        lines.append(f"answered  {answer} by {item.answered_by or '-'} at {show.time(item.decide_time)}")
    parts: list[RenderableType] = [head]
    # What would happen first (a small terminal shows it without scrolling), then the request.
    if item.kind == "apply":
        parts.append(Syntax(item.diff or "(empty diff)", "diff", theme="ansi_dark", word_wrap=True))
    else:
        if item.command:
            parts.append(Text("command line: " + " ".join(item.command)))
        args = json_format.MessageToDict(item.args) if item.HasField("args") else {}
        parts.append(Text(f"{item.tool} arguments:", style="bold"))
        parts.append(Syntax(show.text(json.dumps(args, indent=2, sort_keys=True)), "json", theme="ansi_dark"))
    parts.append(Text("\n" + "\n".join(lines)))
    parts.append(Text("a allow once · A allow always · x reject once · X reject always", style="dim"))
    return Group(*parts)


class ApprovalsScreen(Listing):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("a", "answer('allow_once')", "Allow once"),
        Binding("A", "answer('allow_always')", "Allow always"),
        Binding("x", "answer('reject_once')", "Reject once"),
        Binding("X", "answer('reject_always')", "Reject always"),
    ]
    OPERATION = "approval.list"
    WHAT = "pending approvals"
    COLUMNS = ("id", "kind", "what", "plan", "rule", "asked at")
    PLACEHOLDER = "/ filter: any text (tool, command, plan, rule)"
    HINT = "a/A allow once/always · x/X reject once/always"
    DEFAULT_CSS = """
    ApprovalsScreen #rows { height: auto; max-height: 8; }
    ApprovalsScreen #detail { height: 1fr; border-top: solid $accent; }
    """

    def __init__(self) -> None:
        super().__init__()
        # What the last answer was told (someone decided first), kept under the list.
        self.told = ""

    def filters(self) -> dict[str, Any]:
        return {"state": PENDING}

    def body(self) -> ComposeResult:
        yield Input(placeholder=self.PLACEHOLDER, id="filter")
        table: DataTable[str] = DataTable(id="rows", cursor_type="row", zebra_stripes=True)
        table.add_columns(*self.COLUMNS)
        yield table
        yield Static(f"loading {self.WHAT}…", id="status", classes="status")
        with VerticalScroll(id="detail"):
            yield Static("", id="approval")

    def key(self, item: Any) -> str:
        return str(item.id)

    def cells(self, item: Any) -> Sequence[str]:
        show = self.acp.show
        return (
            show.id(item.id),
            item.kind,
            what(item)[:60],
            show.id(item.plan_id),
            item.rule,
            show.time(item.create_time),
        )

    def current(self) -> approval_pb2.Approval | None:
        key = self.selected()
        return next((item for item in self.items if item.id == key), None)

    def show_rows(self) -> None:
        super().show_rows()
        if self.told:
            self.query_one("#status", Static).update(Text(self.told, style="bold"))
        self.show_detail()

    def show_detail(self) -> None:
        item = self.current()
        self.query_one("#approval", Static).update(
            details(item, self.acp.show) if item is not None else "nothing waits for an answer"
        )

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show_detail()

    def open(self, key: str) -> None:
        self.query_one("#detail", VerticalScroll).focus()

    def on_acp_event(self, event: events_pb2.Event) -> None:
        if event.WhichOneof("payload") in PAYLOADS:
            self.reload_soon()

    def action_answer(self, answer: str) -> None:
        item = self.current()
        if item is None:
            self.notify("no request selected", severity="warning")
            return

        def confirmed(yes: bool | None) -> None:
            if yes:
                self.answer(item, answer)

        question = f"{ANSWERS[answer]}?\n{item.kind} {what(item)} · plan {self.acp.show.id(item.plan_id)}"
        self.app.push_screen(Confirm(question), confirmed)

    @work(group="act")
    async def answer(self, item: approval_pb2.Approval, answer: str) -> None:
        show = self.acp.show
        try:
            await self.acp.client.call(
                "approval.answer",
                approval_id=item.id,
                answer=approval_pb2.ApprovalAnswer.Value(f"APPROVAL_ANSWER_{answer.upper()}"),
                digest=item.digest,
            )
        except ACPError as exc:
            refinement = exc.details.get("refinement")
            if refinement == "APPROVAL_DECIDED":
                told = (
                    f"Already decided by {exc.details.get('answered_by', 'someone')} "
                    f"({exc.details.get('answer', '?')}): your {answer} was not applied."
                )
            elif refinement == "APPROVAL_VOID":
                replaced = exc.details.get("replaced_by", "")
                told = "This request no longer applies (what it asked about changed)" + (
                    f"; the new request is {show.id(str(replaced))}." if replaced else "."
                )
            else:
                self.acp.report(exc)
                return
            self.told = show.text(told)
            self.notify(show.text(told), severity="warning", timeout=8)
            self.load()
            return
        self.told = ""
        self.notify(f"{answer}: {item.kind} {what(item)}")
        self.load()
