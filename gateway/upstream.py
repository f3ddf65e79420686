"""Gateway-only mode: the ``Service`` the HTTP gateway calls is an upstream ACP server.

``TransportService`` turns the seam's ``CallContext`` back into the ``CallOptions`` of a
client ``Transport`` (the CLI hands in a gRPC one): the caller's token, ticket, version and
request id travel upstream, which does every check. The gateway itself never imports a
client: whoever assembles it chooses the transport.

The gateway calls upstream once and never retries: its own caller decides (an ACP client
retries with the same request id, as its ``RetryPolicy`` says). An upstream it cannot reach
answers at once INTERNAL_ERROR with ``details.grpc_code`` UNAVAILABLE and, when another
attempt may get past it, ``details.retryable``, instead of after the transport's retries
(about six seconds for a closed port), which a retrying client would multiply.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from google.protobuf import message

from cleveragents.acp.contract import catalog, envelope
from cleveragents.acp.contract.call import CallContext, Reply
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError, TransportError
from cleveragents.acp.contract.retry import RetryPolicy, retryable
from cleveragents.acp.contract.transport import CallOptions, Transport


def options_of(ctx: CallContext) -> CallOptions:
    """The upstream's answer fills ``ctx.reply`` (a replay travels back to the HTTP caller)."""
    if ctx.reply is None:
        ctx.reply = Reply()
    return CallOptions(
        acp_version=ctx.acp_version,
        token=ctx.token,
        request_id=ctx.request_id,
        ticket=ctx.ticket,
        transport=ctx.transport,
        traceparent=ctx.traceparent,
        retry=RetryPolicy.OFF,
        reply=ctx.reply,
        if_revision=ctx.if_revision,
    )


def _offer_retry(error: TransportError) -> None:
    """The upstream was not reached, or was lost: the caller may try again where the
    transport would have (``details.retryable``, as the server's own STORE_BUSY says)."""
    if retryable(error):
        error.details["retryable"] = True


class TransportService:
    """A ``Service`` over a client ``Transport`` to another server."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    async def invoke(self, op: Operation, request: message.Message, ctx: CallContext) -> message.Message:
        try:
            return await self.transport.call(op, request, options_of(ctx))
        except TransportError as exc:
            _offer_retry(exc)
            raise

    async def stream(
        self, op: Operation, request: message.Message, ctx: CallContext
    ) -> AsyncIterator[message.Message]:
        try:
            return await self.transport.open_stream(op, request, options_of(ctx))
        except TransportError as exc:
            _offer_retry(exc)
            raise

    async def admit_caller(self, op: Operation, ctx: CallContext) -> None:
        """Nothing here: the upstream checks the caller of every call it is sent."""

    async def close(self) -> None:
        await self.transport.close()


async def unreachable(transport: Transport, seconds: float = 5.0) -> str | None:
    """Why the upstream cannot be reached now (None: it answered, even with an error). The
    gateway starts anyway, as an upstream may come later, but says so at once rather than
    at the first caller's INTERNAL_ERROR."""
    op = catalog.OPERATIONS["meta.version"]
    options = CallOptions(
        acp_version=None, token=None, request_id=envelope.new_request_id(), retry=RetryPolicy.OFF
    )
    try:
        async with asyncio.timeout(seconds):
            await transport.call(op, op.request_type(), options)
    except TimeoutError:
        return f"no answer in {seconds:g} s"
    except TransportError as exc:
        return exc.message
    except ACPError:
        return None
    return None
