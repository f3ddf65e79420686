"""The transport interface of ``ACPClient``: one call, one stream, close.

Transports never interpret results: they carry a request message to the service and
bring back the response message, or raise the service's ``ACPError``.

``open_stream`` admits a stream (authentication, version, parameters) and returns its
items without waiting for the first one, so a gateway can answer an early error with a
real status before it sends any stream headers; ``stream`` is the same as one iterator.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from google.protobuf import message

from cleveragents.acp.contract.catalog import Operation

# gRPC metadata carrying a stream ticket (a gateway passes a browser's upstream).
TICKET_METADATA = "acp-stream-ticket"


@dataclass(slots=True)
class CallOptions:
    """Per call; built on every call's path, hence slotted and not frozen (a frozen
    dataclass sets each field through ``object.__setattr__``: twice the cost)."""

    acp_version: str | None
    token: str | None
    request_id: str
    # A stream ticket (events.ticket) instead of a token: a browser's EventSource has one.
    ticket: str | None = None


class Transport(Protocol):
    async def call(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> message.Message: ...

    async def open_stream(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> AsyncIterator[message.Message]:
        """Admit the stream (auth, version, filters: errors raise here) and return its items."""

    async def close(self) -> None: ...


class StreamItems:
    """The items of an admitted stream. ``aclose`` releases the stream (the HTTP response,
    the gRPC call) even when no item was read, which closing an unstarted generator would not."""

    def __init__(self, items: AsyncIterator[message.Message], release: Callable[[], Awaitable[None]]) -> None:
        self._items = items
        self._release = release
        self.released = False

    def __aiter__(self) -> StreamItems:
        return self

    async def __anext__(self) -> message.Message:
        return await anext(self._items)

    async def aclose(self) -> None:
        try:
            aclose = getattr(self._items, "aclose", None)
            if aclose is not None:
                await aclose()
        finally:
            self.released = True
            await self._release()
