"""``client.on(filters, callback)``: the event stream as a callback registration.

Beside ``ACPClient.subscribe`` (an async iterator the caller drives), ``on`` runs the
subscription in a task of its own and hands each event to ``callback``. When the connection
is lost, the server restarts, the stream ends or the server drops a subscriber that fell
behind (SUBSCRIBER_TOO_SLOW), it subscribes again after the last sequence it delivered: no
event is missed (while the server retains it) and none is delivered twice. Any other error
(a wrong token, a filter the server refuses) ends it; ``Listener.error`` says which.

``on_state(connected, error)`` is told each change of the connection: ``(False, error)``
when it is lost (the error that lost it), ``(True, None)`` when a subscription is admitted
again. The returned ``Listener`` stops with ``await listener.stop()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any, Protocol

from cleveragents.acp.contract import codec
from cleveragents.acp.contract.errors import ACPError, TransportError
from cleveragents.acp.contract.retry import RetryPolicy
from cleveragents.acp.v1 import events_pb2

EventCallback = Callable[[events_pb2.Event], Awaitable[None] | None]
StateCallback = Callable[[bool, ACPError | None], Awaitable[None] | None]
Filters = Mapping[str, Any] | events_pb2.SubscribeEventsRequest | None


class EventSource(Protocol):
    """What a listener needs of ``ACPClient``."""

    async def open_events(
        self, request: events_pb2.SubscribeEventsRequest, *, retry: RetryPolicy | None = None
    ) -> AsyncGenerator[events_pb2.Event, None]: ...


FIRST_DELAY = 0.2
MAX_DELAY = 5.0


def resumable(exc: ACPError) -> bool:
    """A lost connection or a server that dropped a slow subscriber: subscribe again."""
    return isinstance(exc, TransportError) or exc.details.get("refinement") == "SUBSCRIBER_TOO_SLOW"


async def _told(callback: Callable[..., Awaitable[None] | None] | None, *args: Any) -> None:
    if callback is None:
        return
    result = callback(*args)
    if inspect.isawaitable(result):
        await result


class Listener:
    """A running callback registration (module docstring)."""

    def __init__(
        self,
        client: EventSource,
        filters: Filters,
        callback: EventCallback,
        on_state: StateCallback | None = None,
    ) -> None:
        if isinstance(filters, events_pb2.SubscribeEventsRequest):
            request = filters
        else:
            request = codec.from_dict(dict(filters or {}), events_pb2.SubscribeEventsRequest)
        self._client = client
        self._request = request
        self._callback = callback
        self._on_state = on_state
        # The sequence of the last event delivered: the next subscription starts after it.
        self.last_sequence = request.after_sequence
        self.connected = False
        self.reconnects = 0
        self.error: ACPError | None = None
        self._task = asyncio.create_task(self._run(), name="acp-listener")

    @property
    def done(self) -> bool:
        return self._task.done()

    async def _run(self) -> None:
        delay = FIRST_DELAY
        lost = False
        while True:
            request = events_pb2.SubscribeEventsRequest()
            request.CopyFrom(self._request)
            request.after_sequence = self.last_sequence
            try:
                # This loop is the retrying: the transport's own is off, so a loss is told at once.
                events = await self._client.open_events(request, retry=RetryPolicy.OFF)
                try:
                    await self._connected(lost)
                    lost, delay = False, FIRST_DELAY
                    async for event in events:
                        if event.sequence <= self.last_sequence:
                            continue
                        self.last_sequence = event.sequence
                        await _told(self._callback, event)
                finally:
                    await events.aclose()
                # A stream that ends (a server shutting down) is resumed like a lost one.
                error: ACPError = TransportError("the server closed the event stream")
            except ACPError as exc:
                if not resumable(exc):
                    self.error = exc
                    self.connected = False
                    await _told(self._on_state, False, exc)
                    return
                error = exc
            if self.connected or not lost:
                self.connected = False
                lost = True
                await _told(self._on_state, False, error)
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_DELAY)

    async def _connected(self, lost: bool) -> None:
        self.connected = True
        if lost:
            self.reconnects += 1
        await _told(self._on_state, True, None)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
