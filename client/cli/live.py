"""Model text as it streams, for people: ``plan execute --wait`` shows a plan actor's
``plan.text_delta`` events among its progress lines, and ``session chat`` prints the
orchestrator's ``session.text_delta`` events as they arrive, then only the replies that did
not stream (a started plan, a slash command's answer).

A server speaking ACP 1.1 has no text deltas: chat then prints the replies when they come.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TextIO

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import events_pb2, session_pb2

TEXT_EVENTS = ["session.text_delta", "session.message"]
# How long chat waits, after tell answers, for the stream to catch up with the replies.
SYNC_SECONDS = 2.0


class TextLines:
    """Writes progress lines and streamed text to one stream without mixing them on a line."""

    def __init__(self, out: TextIO, prefix: str = "") -> None:
        self.out = out
        self.prefix = prefix
        self._open: tuple[str, int] | None = None

    def line(self, text: str) -> None:
        self.end()
        self.out.write(text + "\n")
        self.out.flush()

    def delta(self, key: str, turn: int, text: str) -> None:
        if self._open != (key, turn):
            self.end()
            self.out.write(self.prefix)
            self._open = (key, turn)
        self.out.write(text)
        self.out.flush()

    def end(self) -> None:
        if self._open is not None:
            self.out.write("\n")
            self.out.flush()
            self._open = None


def plan_text(event: events_pb2.Event) -> events_pb2.TextDelta | None:
    return event.plan_text_delta if event.WhichOneof("payload") == "plan_text_delta" else None


class LiveReplies:
    """Follows one session's text while chat runs; ``settle`` prints what did not stream."""

    def __init__(self, client: ACPClient, session_id: str, first_index: int, out: TextIO) -> None:
        self.client = client
        self.session_id = session_id
        # Messages below this index were there before the chat started: not shown again.
        self.first_index = first_index
        self.writer = TextLines(out)
        self.streamed: list[str] = []
        self.last_index = -1
        self._turn_text: dict[int, list[str]] = {}
        self._seen = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.available = True

    async def start(self) -> None:
        stream = aiter(self.client.subscribe(session_id=self.session_id, event_type=TEXT_EVENTS))
        self._task = asyncio.create_task(self._follow(stream))

    async def _follow(self, stream: object) -> None:
        armed = False
        try:
            async for event in stream:  # type: ignore[attr-defined]
                kind = event.WhichOneof("payload")
                if kind == "session_message":
                    message = event.session_message.message
                    armed = armed or message.index >= self.first_index
                    if armed:
                        self._close_turns()
                        self.last_index = message.index
                        self._seen.set()
                elif kind == "session_text_delta" and armed:
                    delta = event.session_text_delta
                    self._turn_text.setdefault(delta.turn, []).append(delta.text)
                    self.writer.delta("session", delta.turn, delta.text)
        except ACPError as exc:
            if exc.code != "VERSION_MISMATCH":
                raise
            self.available = False

    def _close_turns(self) -> None:
        self.writer.end()
        self.streamed.extend("".join(parts) for _, parts in sorted(self._turn_text.items()))
        self._turn_text.clear()

    async def settle(self, response: session_pb2.TellSessionResponse) -> list[session_pb2.Message]:
        """The replies still to print: wait (bounded) until the stream has shown this tell's
        messages, then leave out each reply whose text streamed."""
        if not response.replies or not self.available:
            return list(response.replies)
        last = response.replies[-1].index
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(SYNC_SECONDS):
                while self.last_index < last and not (self._task and self._task.done()):
                    self._seen.clear()
                    if self.last_index < last:
                        await self._seen.wait()
        self._close_turns()
        pending = list(response.replies)
        for text in self.streamed:
            match = next((r for r in pending if r.content == text), None)
            if match is not None:
                pending.remove(match)
        self.streamed.clear()
        return pending

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ACPError):
                await self._task
