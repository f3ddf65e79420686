"""context.*: handlers over the ``Context`` domain service."""

from __future__ import annotations

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.facade.domain.context.service import Context
from cleveragents.acp.facade.handlers.table import handles
from cleveragents.acp.v1 import context_pb2


class ContextHandlers:
    def __init__(self, context: Context) -> None:
        self._context = context

    @handles("context.show")
    async def GetContext(
        self, request: context_pb2.GetContextRequest, ctx: CallContext
    ) -> context_pb2.GetContextResponse:
        return await self._context.show(ctx, request)

    @handles("context.inspect")
    async def InspectContext(
        self, request: context_pb2.InspectContextRequest, ctx: CallContext
    ) -> context_pb2.InspectContextResponse:
        return await self._context.inspect(ctx, request)

    @handles("context.simulate")
    async def SimulateContext(
        self, request: context_pb2.SimulateContextRequest, ctx: CallContext
    ) -> context_pb2.SimulateContextResponse:
        return await self._context.simulate(ctx, request)

    @handles("context.set")
    async def SetContext(
        self, request: context_pb2.SetContextRequest, ctx: CallContext
    ) -> context_pb2.SetContextResponse:
        return await self._context.set(ctx, request)
