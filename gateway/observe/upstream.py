"""Gateway-only mode (``agents gateway --upstream``): the calls the gateway passes upstream,
counted, logged and traced here as the server counts its own, with the trace continued over
the gRPC hop so one trace spans both processes."""

from __future__ import annotations

from collections.abc import AsyncIterator

from google.protobuf import message

from cleveragents.acp.contract.batched import Batched
from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.contract.transport import CallOptions, Transport
from cleveragents.acp.facade import observer as observing
from cleveragents.acp.gateway.observe import tracing
from cleveragents.acp.gateway.observe.telemetry import CallTelemetry


def _context(options: CallOptions) -> CallContext:
    return CallContext(
        request_id=options.request_id, transport=options.transport, traceparent=options.traceparent
    )


class ObservedTransport:
    def __init__(self, transport: Transport, telemetry: CallTelemetry) -> None:
        self._transport = transport
        self._telemetry = telemetry

    async def call(self, op: Operation, request: message.Message, options: CallOptions) -> message.Message:
        observed = self._telemetry.start(op, request, _context(options))
        code = observing.CANCELLED
        try:
            options.traceparent = tracing.inject().get(tracing.TRACEPARENT, options.traceparent)
            response = await self._transport.call(op, request, options)
            code = observing.OK
            return response
        except ACPError as err:
            code = err.code
            raise
        finally:
            observed.finish(code)

    async def open_stream(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> AsyncIterator[message.Message]:
        ctx = _context(options)
        observed = self._telemetry.start(op, request, ctx)
        code = observing.CANCELLED
        try:
            options.traceparent = tracing.inject().get(tracing.TRACEPARENT, options.traceparent)
            items = await self._transport.open_stream(op, request, options)
            code = observing.OK
        except ACPError as err:
            code = err.code
            raise
        finally:
            observed.finish(code)
        return Batched(observing.watched(items, self._telemetry, op, ctx))

    async def close(self) -> None:
        await self._transport.close()
