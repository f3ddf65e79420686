"""What every screen is: the header, the connection banner, its body and the footer of its
keys; and what a screen may ask of the app (``Host``), so screens never import the app."""

from __future__ import annotations

from collections import deque
from typing import Any, Protocol

from google.protobuf import message
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.tui.display import Display
from cleveragents.acp.contract.errors import ACPError, TransportError
from cleveragents.acp.contract.listening import Listener
from cleveragents.acp.v1 import events_pb2


class Host(Protocol):
    """The app, as screens use it."""

    show: Display
    events: deque[events_pb2.Event]
    listener: Listener | None

    @property
    def client(self) -> ACPClient: ...

    async def call(self, operation: str, params: Any = None, **fields: Any) -> message.Message | None: ...

    def report(self, exc: ACPError) -> None: ...

    def copy_id(self, value: str, what: str) -> None: ...


def describe(exc: ACPError) -> str:
    if isinstance(exc, TransportError):
        return f"connection lost: {exc.message}"
    return f"{exc.code}: {exc.message}"


class Banner(Static):
    """The connection's trouble, on every screen, until it is over."""

    DEFAULT_CSS = """
    Banner { background: $error; color: $text; height: auto; padding: 0 1; display: none; }
    Banner.shown { display: block; }
    """

    def on_mount(self) -> None:
        self.watch(self.app, "banner", self._show, init=True)

    def _show(self, text: str) -> None:
        self.update(text)
        self.set_class(bool(text), "shown")


class Page(Screen[None]):
    """A screen with the header, the banner, its body and the footer of its keys."""

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield Banner()
        yield from self.body()
        yield Footer()

    def body(self) -> ComposeResult:
        yield from ()

    @property
    def acp(self) -> Host:
        host: Host = self.app  # type: ignore[assignment]
        return host

    def on_acp_event(self, event: events_pb2.Event) -> None:
        """Each event as it arrives (the screens that show live data override this)."""

    def reconnected(self) -> None:
        """The connection is back: read again what may have changed meanwhile."""
