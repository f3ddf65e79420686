"""What the facade tells an observer about each call: the seam where metrics, traces and
access logs attach, once below every transport, without the facade knowing how they are kept.

The server installs one (``gateway.observe.telemetry.CallTelemetry``); in-process clients and
tests run with ``NO_OBSERVER``, which costs one attribute test per call.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

from google.protobuf import message

from cleveragents.acp.contract.batched import close_iterator, next_batch
from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError

OK = "OK"
# A call whose caller went away (a disconnect, a deadline) before it was answered.
CANCELLED = "CANCELLED"


class ObservedCall(Protocol):
    """One call in flight; ``finish`` is called exactly once with its ACP code (``OK``)."""

    def finish(self, code: str) -> None: ...


class ObservedStream(Protocol):
    """One admitted stream; ``ended`` is called exactly once with why it ended."""

    def ended(self, reason: str) -> None: ...


class CallObserver(Protocol):
    def start(self, op: Operation, request: message.Message, ctx: CallContext) -> ObservedCall:
        """Called before admission, so refused calls are seen too. May make a span current:
        the call runs inside the context this leaves, and ``finish`` restores the caller's."""

    def stream_opened(self, op: Operation, ctx: CallContext) -> ObservedStream: ...


# Why a stream ended: a bounded set, so it can be a metric label.
STREAM_CLOSED = "closed"
STREAM_TOO_SLOW = "too_slow"
STREAM_AUTH = "auth"
STREAM_SHUTDOWN = "shutdown"
STREAM_ERROR = "error"


def stream_end_reason(err: ACPError) -> str:
    """The bounded reason an ACP error ends a stream with."""
    refinement = err.details.get("refinement")
    if refinement == "SUBSCRIBER_TOO_SLOW":
        return STREAM_TOO_SLOW
    if err.code in ("AUTH_REQUIRED", "AUTH_FORBIDDEN"):
        return STREAM_AUTH
    if refinement == "SERVER_SHUTTING_DOWN":
        return STREAM_SHUTDOWN
    return STREAM_ERROR


async def watched(
    items: AsyncIterator[message.Message], observer: CallObserver, op: Operation, ctx: CallContext
) -> AsyncGenerator[list[message.Message], None]:
    """A stream's items, in the batches ``items`` hands out; tells ``observer`` once it is
    read, and once why it ended (a stream closed before its first item was asked for was
    never open). Closes ``items``."""
    observed = observer.stream_opened(op, ctx)
    reason = STREAM_CLOSED
    try:
        while True:
            try:
                batch = await next_batch(items)
            except StopAsyncIteration:
                return
            yield batch
    except ACPError as err:
        reason = stream_end_reason(err)
        raise
    except Exception:
        reason = STREAM_ERROR
        raise
    finally:
        try:
            await close_iterator(items)
        finally:
            observed.ended(reason)
