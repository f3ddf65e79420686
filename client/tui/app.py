"""The application: one ``ACPClient``, one event listener (``client.on``) feeding every screen,
the connection banner, and the keys that reach every screen.

Each top-level screen is a Textual mode with a stack of its own (sessions, plans, events,
registries, approvals); a session or a plan opens on top of its list and ``escape`` goes back.
Every call goes through ``ACPApp.call``: an error is told (a lost connection in the banner, which
stays until the listener is connected again), never raised into the interface. Work that waits
on the server runs in workers, so keys are answered meanwhile.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable
from typing import Any, ClassVar

from google.protobuf import message
from textual import work
from textual.app import App
from textual.binding import Binding, BindingType
from textual.reactive import reactive
from textual.screen import Screen

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.tui import approvals, events, plans, registries, sessions
from cleveragents.acp.client.tui.display import Display
from cleveragents.acp.client.tui.page import Page, describe
from cleveragents.acp.contract.errors import ACPError, TransportError
from cleveragents.acp.contract.listening import Listener
from cleveragents.acp.contract.retry import Retrying
from cleveragents.acp.v1 import events_pb2

# The events kept for the events screen (newest last); older ones scroll away.
KEPT_EVENTS = 5000
AUTH_CODES = ("AUTH_REQUIRED", "AUTH_FORBIDDEN", "VERSION_MISMATCH")


class ACPApp(App[None]):
    TITLE = "agents tui"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("s", "switch_mode('sessions')", "Sessions"),
        Binding("p", "switch_mode('plans')", "Plans"),
        Binding("e", "switch_mode('events')", "Events"),
        Binding("r", "switch_mode('registries')", "Registries"),
        Binding("i", "switch_mode('approvals')", "Approvals"),
        Binding("question_mark,f1", "keys", "Keys"),
        Binding("q", "quit", "Quit"),
    ]
    CSS = """
    .status { height: auto; padding: 0 1; color: $text-muted; }
    .error { color: $error; }
    DataTable { height: 1fr; }
    """

    MODES: ClassVar[dict[str, str | Callable[[], Screen[Any]]]] = {
        "sessions": sessions.SessionsScreen,
        "plans": plans.PlansScreen,
        "events": events.EventsScreen,
        "registries": registries.RegistriesScreen,
        "approvals": approvals.ApprovalsScreen,
    }

    banner: reactive[str] = reactive("")
    # Pending approval requests, in the header of every screen (see ``approvals.Pending``).
    pending: reactive[int] = reactive(0)

    def __init__(
        self,
        opener: Callable[[], ACPClient],
        *,
        where: str,
        display: Display | None = None,
        owns_client: bool = True,
    ) -> None:
        super().__init__()
        self.opener = opener
        self.where = where
        self.show = display or Display()
        self.owns_client = owns_client
        self.sub_title = where
        self.approvals = approvals.Pending()
        self.events: deque[events_pb2.Event] = deque(maxlen=KEPT_EVENTS)
        self.online = False
        self.listener: Listener | None = None
        self._client: ACPClient | None = None

    @property
    def client(self) -> ACPClient:
        assert self._client is not None, "the client opens when the app starts"
        return self._client

    async def on_mount(self) -> None:
        try:
            self._client = self.opener()
        except Exception as exc:
            self.banner = f"cannot connect to {self.where}: {exc}"
            return
        self.listener = self.client.on({}, self._event, on_state=self._state)
        self.count_pending()
        await self.switch_mode("sessions")

    def watch_pending(self, count: int) -> None:
        self.sub_title = f"{self.where} · {approvals.count_text(count)}"

    @work(exclusive=True, group="pending")
    async def count_pending(self) -> None:
        """Read the pending requests again (at start and after a lost connection); events keep
        the count between reads."""
        try:
            found = await self.approvals.read(self.client.call)
        except ACPError as exc:
            if isinstance(exc, TransportError) or exc.code in AUTH_CODES:
                self.report(exc)
            else:
                # A server (or --acp-version) without the approval operations: said in the
                # header, not as an error on every start.
                self.sub_title = f"{self.where} · approvals not served ({exc.code})"
            return
        if found is not None:
            self.pending = found

    async def on_unmount(self) -> None:
        if self.listener is not None:
            await self.listener.stop()
        if self._client is not None and self.owns_client:
            with contextlib.suppress(ACPError, OSError):
                await self._client.close()

    async def call(self, operation: str, params: Any = None, **fields: Any) -> message.Message | None:
        """The answer, or ``None`` once the error is told (banner or notification)."""
        try:
            return await self.client.call(operation, params, **fields)
        except ACPError as exc:
            self.report(exc)
            return None

    def report(self, exc: ACPError) -> None:
        if isinstance(exc, TransportError):
            self.online = False
            self.banner = (
                f"Connection to {self.where} lost ({exc.message}); reconnecting. What you typed is kept."
            )
        elif exc.code in AUTH_CODES:
            self.banner = f"{describe(exc)} ({self.where}: check the token, profile or --acp-version)"
        else:
            self.notify(self.show.text(describe(exc)), severity="error", timeout=8)

    def _event(self, event: events_pb2.Event) -> None:
        self.events.append(event)
        self.pending = self.approvals.follow(event)
        for screen in self._every_screen():
            try:
                screen.on_acp_event(event)
            except Exception as exc:
                self.log.error(f"event {event.sequence} on {screen}: {exc!r}")

    def _every_screen(self) -> list[Page]:
        screens: list[Page] = []
        for stack in self._screen_stacks.values():
            screens += [screen for screen in stack if isinstance(screen, Page)]
        return screens

    def _state(self, connected: bool, error: ACPError | None) -> None:
        was = self.online
        self.online = connected
        if connected:
            self.banner = ""
            if not was:
                self.count_pending()
                for screen in self._every_screen():
                    screen.reconnected()
        elif error is not None:
            self.report(error)

    def retrying(self, retrying: Retrying) -> None:
        """The transport retries a call the server left unanswered: say so in the banner."""
        self.online = False
        self.banner = (
            f"No answer from {self.where} ({retrying.error.message}); retrying "
            f"(attempt {retrying.attempt} of {retrying.attempts}). What you typed is kept."
        )

    def action_keys(self) -> None:
        from cleveragents.acp.client.tui.modals import KeysScreen, key_rows

        self.push_screen(KeysScreen(key_rows(self.screen)))

    def copy_id(self, value: str, what: str) -> None:
        """Copy an id: to the terminal's clipboard (OSC 52) and the app's own."""
        if not value:
            self.notify(f"no {what} selected", severity="warning")
            return
        self.copy_to_clipboard(value)
        self.notify(f"copied {what} {self.show.id(value)}")
