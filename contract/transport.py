"""The two seams of a call: ``Transport`` (what ``ACPClient`` calls: one call, one stream,
close) and ``Service`` (what every server calls: ``ServiceFacade`` in one process).

Transports never interpret results: they carry a request message to the service and
bring back the response message, or raise the service's ``ACPError``. A transport takes
``CallOptions`` (what a caller says); a service takes the ``CallContext`` it fills in (the
principal and the served version, once checked). ``ServiceTransport`` is a transport over
any service, in the same process.

``open_stream`` admits a stream (authentication, version, parameters) and returns its
items without waiting for the first one, so a gateway can answer an early error with a
real status before it sends any stream headers; ``stream`` is the same as one iterator.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from google.protobuf import message

from cleveragents.acp.contract.call import CallContext, Reply
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.retry import RetryPolicy

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
    # The wire the call came in on, when a gateway passes it on (``CallContext.transport``).
    transport: str = "local"
    # W3C ``traceparent`` to continue (a gateway passes its caller's, or its own span's).
    traceparent: str | None = None
    # How a network transport retries this call (None: the transport's own policy).
    retry: RetryPolicy | None = None
    # Given, it is filled in with what the answer says besides its message (a replay).
    reply: Reply | None = None
    # The revision the caller read of the session or plan the call mutates (contract/revisions.py).
    if_revision: int | None = None


class Transport(Protocol):
    async def call(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> message.Message: ...

    async def open_stream(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> AsyncIterator[message.Message]:
        """Admit the stream (auth, version, filters: errors raise here) and return its items."""

    async def close(self) -> None: ...


class Service(Protocol):
    """The one seam below every server: the gRPC servicer and the HTTP gateway both call
    ``invoke`` and ``stream`` (``ServiceFacade``; in gateway-only mode, its upstream)."""

    async def invoke(self, op: Operation, request: message.Message, ctx: CallContext) -> message.Message: ...

    async def stream(
        self, op: Operation, request: message.Message, ctx: CallContext
    ) -> AsyncIterator[message.Message]:
        """Admit the stream (errors raise here, before any item) and return its items."""

    async def admit_caller(self, op: Operation, ctx: CallContext) -> None:
        """Authenticate and authorize the caller of ``op`` before its request is decoded
        (sets ``ctx.principal``; ``invoke`` checks it again): a server holding a large
        request asks this before giving it one of its few places."""


def context_of(options: CallOptions) -> CallContext:
    """What a caller's options say, as the context a service fills in."""
    return CallContext(
        token=options.token,
        acp_version=options.acp_version,
        request_id=options.request_id,
        request_id_given=bool(options.request_id),
        ticket=options.ticket,
        transport=options.transport,
        traceparent=options.traceparent,
        reply=options.reply,
        if_revision=options.if_revision,
    )


class ServiceTransport:
    """A ``Transport`` over a ``Service`` in the same process: no serialization, no network."""

    def __init__(self, service: Service) -> None:
        self.service = service

    def call(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> Coroutine[Any, Any, message.Message]:
        """The service's own awaitable: no frame of this transport's between caller and service."""
        return self.service.invoke(op, request, context_of(options))

    async def open_stream(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> AsyncIterator[message.Message]:
        return await self.service.stream(op, request, context_of(options))

    async def close(self) -> None:
        """The service is its owner's to close."""


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
