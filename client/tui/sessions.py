"""The sessions list and one session: its history, the orchestrator's text as it streams, the
prompt (with the multitask policy of ACP 1.3) and the cancel of a running turn.

A tell is sent in the background (``background: true``): the answer is the queued turn, and
everything after it — the user's message joining the history, the text deltas, the replies,
the turn's end — arrives as events, from this client or any other. The prompt is cleared only
once the server has the message: a refused or lost tell leaves what was typed in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal
from textual.widgets import Input, RichLog, Select, Static

from cleveragents.acp.client.tui.display import enum
from cleveragents.acp.client.tui.listing import Listing
from cleveragents.acp.client.tui.modals import Ask
from cleveragents.acp.client.tui.page import Page
from cleveragents.acp.v1 import events_pb2, session_pb2

PAGE = 500
# The history shows this many messages at first; ``m`` shows as many more, earlier ones.
SHOWN = 200
MULTITASK = ("enqueue", "reject", "interrupt", "rollback")
SESSION_EVENTS = ("session_message", "session_updated", "session_turn_completed")


class SessionsScreen(Listing):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("n", "create", "New")]
    OPERATION = "session.list"
    WHAT = "sessions"
    COLUMNS = ("id", "title", "project", "orchestrator", "state", "msgs")
    PLACEHOLDER = "/ filter: any text, or state:active"
    HINT = "enter opens · / filters · n new · y copies the id"

    def cells(self, item: Any) -> Sequence[str]:
        show = self.acp.show
        return (
            show.id(item.meta.id),
            show.text(item.title) or "-",
            item.project or "-",
            item.orchestrator,
            enum(session_pb2.SessionState, item.state),
            str(item.message_count),
        )

    def matches(self, words: list[str], cells: Sequence[str]) -> bool:
        plain = [word for word in words if not word.startswith("state:")]
        states = {word.removeprefix("state:") for word in words if word.startswith("state:")}
        return (not states or cells[4] in states) and super().matches(plain, cells)

    def open(self, key: str) -> None:
        self.app.push_screen(SessionScreen(key))

    def action_create(self) -> None:
        def made(title: str | None) -> None:
            if title is not None:
                self.create(title)

        self.app.push_screen(Ask("New session: its title (may be empty)"), made)

    @work(group="create")
    async def create(self, title: str) -> None:
        made = await self.acp.call("session.create", title=title)
        if made is not None:
            assert isinstance(made, session_pb2.CreateSessionResponse)
            self.load()
            self.open(made.session.meta.id)

    def on_acp_event(self, event: events_pb2.Event) -> None:
        if event.WhichOneof("payload") in SESSION_EVENTS:
            self.reload_soon()


def history_width(log: RichLog) -> int | None:
    """The width to wrap at: the log's own once it is laid out (RichLog would measure against
    the terminal's first width, and never wrap wider)."""
    return log.scrollable_content_region.width or None


class SessionScreen(Page):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("ctrl+t", "cancel_turn", "Cancel turn"),
        Binding("ctrl+o", "earlier", "Older"),
        Binding("ctrl+y", "copy", "Copy id"),
        Binding("ctrl+r", "reload", "Reload"),
    ]
    DEFAULT_CSS = """
    #history { height: 1fr; border: round $primary-darken-2; }
    #live { height: auto; max-height: 8; padding: 0 1; color: $success; }
    #live.empty, #turn.empty { display: none; }
    #prompt-row { height: 3; }
    #prompt { width: 1fr; }
    #multitask { width: 20; }
    """

    def __init__(self, session_id: str) -> None:
        super().__init__()
        self.session_id = session_id
        self.session: session_pb2.Session | None = None
        self.messages: dict[int, session_pb2.Message] = {}
        self.shown = SHOWN
        self.rendered = -1  # the index of the last message written to the history
        self.live_text: dict[str, str] = {}  # turn id -> the text streamed so far
        self.turn: session_pb2.Turn | None = None  # the turn queued or running, if any

    def body(self) -> ComposeResult:
        yield Static("", id="title", classes="status")
        yield RichLog(id="history", wrap=True, min_width=20)
        yield Static("", id="live", classes="empty")
        yield Static("", id="turn", classes="status empty")
        with Horizontal(id="prompt-row"):
            prompt = Input(placeholder="message (enter sends; /help asks the orchestrator)", id="prompt")
            # A steady cursor: one that blinks is a redraw twice a second, for nothing.
            prompt.cursor_blink = False
            yield prompt
            yield Select(
                [(name, name) for name in MULTITASK], value="enqueue", allow_blank=False, id="multitask"
            )

    def on_mount(self) -> None:
        self.query_one("#prompt", Input).focus()
        self.load()

    @work(exclusive=True, group="load")
    async def load(self) -> None:
        token = ""
        while True:
            page = await self.acp.call(
                "session.show", session_id=self.session_id, page_size=PAGE, page_token=token
            )
            if page is None:
                return
            assert isinstance(page, session_pb2.GetSessionResponse)
            self.session = page.session
            for item in page.messages:
                self.messages[item.index] = item
            for turn in page.turns:
                if turn.state in (session_pb2.TURN_STATE_QUEUED, session_pb2.TURN_STATE_RUNNING):
                    self.turn = turn
            token = page.next_page_token
            if not token:
                break
        self.show_title()
        self.render_history()
        self.show_turn()

    def show_title(self) -> None:
        session = self.session
        if session is None:
            return
        show = self.acp.show
        state = enum(session_pb2.SessionState, session.state)
        self.query_one("#title", Static).update(
            Text(
                f"session {show.id(session.meta.id)} · {show.text(session.title) or 'untitled'} · "
                f"orchestrator {session.orchestrator} · project {session.project or '-'} · {state} · "
                f"{len(self.messages)} messages"
            )
        )

    def on_resize(self) -> None:
        # The history's lines are wrapped when written: again at the new width.
        if self.messages:
            self.render_history()

    def render_history(self) -> None:
        log = self.query_one("#history", RichLog)
        if history_width(log) is None:
            # Not laid out yet: wrapped now, the lines would keep the terminal's first width.
            self.call_after_refresh(self.render_history)
            return
        log.clear()
        ordered = sorted(self.messages)
        hidden = max(0, len(ordered) - self.shown)
        if hidden:
            log.write(Text(f"… {hidden} earlier messages (ctrl+o shows {SHOWN} more)", style="dim"))
        for index in ordered[hidden:]:
            log.write(self.line(self.messages[index]), width=history_width(log))
        self.rendered = ordered[-1] if ordered else -1

    def line(self, item: session_pb2.Message) -> Text:
        show = self.acp.show
        role = enum(session_pb2.MessageRole, item.role)
        style = "bold cyan" if role == "user" else "green"
        text = Text()
        text.append(f"{show.time(item.create_time)} ", style="dim")
        text.append(f"{role}{' (partial)' if item.partial else ''}: ", style=style)
        text.append(show.text(item.content))
        if item.plan_id:
            text.append(f"  [plan {show.id(item.plan_id)}]", style="magenta")
        return text

    def add_message(self, item: session_pb2.Message) -> None:
        known = item.index in self.messages
        self.messages[item.index] = item
        if item.turn_id in self.live_text and item.role != session_pb2.MESSAGE_ROLE_USER:
            del self.live_text[item.turn_id]
            self.show_live()
        if known:
            return
        if item.index > self.rendered:
            log = self.query_one("#history", RichLog)
            log.write(self.line(item), width=history_width(log))
            self.rendered = item.index
        else:
            self.render_history()
        self.show_title()

    def show_live(self) -> None:
        text = "".join(self.live_text.values())
        live = self.query_one("#live", Static)
        live.update(Text(self.acp.show.text(text)) if text else "")
        live.set_class(not text, "empty")

    def show_turn(self) -> None:
        turn = self.turn
        label = self.query_one("#turn", Static)
        label.set_class(turn is None, "empty")
        if turn is None:
            label.update("")
            return
        state = enum(session_pb2.TurnState, turn.state)
        label.update(f"turn {self.acp.show.id(turn.id)} {state} · ctrl+t cancels it")

    def on_acp_event(self, event: events_pb2.Event) -> None:
        if event.session_id != self.session_id:
            return
        kind = event.WhichOneof("payload")
        if kind == "session_message":
            self.add_message(event.session_message.message)
        elif kind == "session_text_delta":
            delta = event.session_text_delta
            self.live_text[delta.turn_id] = self.live_text.get(delta.turn_id, "") + delta.text
            self.show_live()
        elif kind == "session_turn_started":
            self.turn = event.session_turn_started.turn
            self.show_turn()
        elif kind == "session_turn_completed":
            turn = event.session_turn_completed.turn
            if self.turn is None or self.turn.id == turn.id:
                self.turn = None
                self.show_turn()
            self.live_text.pop(turn.id, None)
            self.show_live()
            if turn.state != session_pb2.TURN_STATE_SUCCEEDED:
                state = enum(session_pb2.TurnState, turn.state)
                why = f": {turn.error.message}" if turn.error.message else ""
                self.notify(f"turn {self.acp.show.id(turn.id)} {state}{self.acp.show.text(why)}")
        elif kind == "session_updated":
            self.session = event.session_updated.session
            self.show_title()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if event.input.id == "prompt" and event.value.strip():
            self.tell(event.value)

    @work(group="tell")
    async def tell(self, content: str) -> None:
        multitask = self.query_one("#multitask", Select).value
        answer = await self.acp.call(
            "session.tell",
            session_id=self.session_id,
            content=content,
            background=True,
            multitask=f"MULTITASK_POLICY_{str(multitask).upper()}",
        )
        if answer is None:
            return  # told; what was typed stays in the prompt
        assert isinstance(answer, session_pb2.TellSessionResponse)
        prompt = self.query_one("#prompt", Input)
        if prompt.value == content:
            prompt.value = ""
        if answer.turn.id and (self.turn is None or self.turn.state != session_pb2.TURN_STATE_RUNNING):
            self.turn = answer.turn
            self.show_turn()

    def action_back(self) -> None:
        self.app.pop_screen()

    @work(group="cancel")
    async def action_cancel_turn(self) -> None:
        if self.turn is None:
            self.notify("no turn is queued or running", severity="warning")
            return
        turn_id = self.turn.id
        ended = await self.acp.call("session.cancel_turn", session_id=self.session_id, turn_id=turn_id)
        if ended is not None:
            self.notify(f"turn {self.acp.show.id(turn_id)} cancelled")

    def action_earlier(self) -> None:
        self.shown += SHOWN
        self.render_history()

    def action_copy(self) -> None:
        self.acp.copy_id(self.session_id, "session id")

    def action_reload(self) -> None:
        self.load()

    def reconnected(self) -> None:
        self.load()
