"""What the TUI tests share: the README tour's registry entries, a display that makes ids and
times stable (snapshots must not change with a run's ULIDs and clock), and waiting on the app."""

from __future__ import annotations

import asyncio
import io
import pathlib
import re
from collections.abc import Callable

from google.protobuf import timestamp_pb2
from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import Static

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.tui.app import ACPApp
from cleveragents.acp.client.tui.display import Display

WAIT = 30.0
ULID = re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b")


class StableDisplay(Display):
    """Each id as ``id-N`` in order of first sight, every time as the same time."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def id(self, value: str) -> str:
        if not value:
            return value
        if value not in self.names:
            self.names[value] = f"id-{len(self.names) + 1}"
        return self.names[value]

    def text(self, value: str) -> str:
        return ULID.sub(lambda match: self.id(match.group(0)), value)

    def time(self, value: timestamp_pb2.Timestamp) -> str:
        return "2026-01-01 12:00:00" if value.seconds or value.nanos else "-"


async def tour(client: ACPClient, folder: pathlib.Path) -> pathlib.Path:
    """The README's quick tour up to the action: a directory resource, project ``demo``, action
    ``hello`` (the scripted actor writes hello.txt). Returns the site folder."""
    site = folder / "site"
    site.mkdir(parents=True)
    await client.call("resource.add", name="site", spec={"type": "directory", "path": str(site)})
    await client.call("project.add", name="demo", spec={"resources": ["site"]})
    steps = [
        {"id": "greet", "tool": "fs.write", "args": {"path": "hello.txt", "content": "Hello, {{name}}!\n"}}
    ]
    await client.call("action.add", name="hello", spec={"actor": "scripted", "steps": steps})
    return site


def app_on(client: ACPClient, *, stable: bool = True, where: str = "test") -> ACPApp:
    return ACPApp(lambda: client, where=where, owns_client=False, display=StableDisplay() if stable else None)


async def until(pilot: Pilot[None], check: Callable[[], object], seconds: float = WAIT) -> None:
    """Wait (bounded) until ``check()`` holds, letting the app work meanwhile."""
    async with asyncio.timeout(seconds):
        while True:
            await pilot.pause(0.02)
            if check():
                return


async def settle(pilot: Pilot[None]) -> None:
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def screen_text(app: ACPApp, selector: str) -> str:
    """The plain text a ``Static`` of the current screen shows."""
    widget = app.screen.query_one(selector, Static)
    console = Console(width=200, file=io.StringIO(), record=True, color_system=None)
    console.print(widget.content)
    return console.export_text()
