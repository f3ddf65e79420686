"""context.*: the ContextService servicer over the ``Context`` domain service."""

from __future__ import annotations

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.facade.domain.context import Context
from cleveragents.acp.v1 import context_pb2, context_pb2_grpc


class ContextFacade(context_pb2_grpc.ContextServiceServicer):
    def __init__(self, context: Context) -> None:
        self._context = context

    async def GetContext(
        self, request: context_pb2.GetContextRequest, context: object
    ) -> context_pb2.GetContextResponse:
        return self._context.show(CallContext.of(context), request)

    async def InspectContext(
        self, request: context_pb2.InspectContextRequest, context: object
    ) -> context_pb2.InspectContextResponse:
        return await self._context.inspect(CallContext.of(context), request)

    async def SimulateContext(
        self, request: context_pb2.SimulateContextRequest, context: object
    ) -> context_pb2.SimulateContextResponse:
        return await self._context.simulate(CallContext.of(context), request)

    async def SetContext(
        self, request: context_pb2.SetContextRequest, context: object
    ) -> context_pb2.SetContextResponse:
        return self._context.set(CallContext.of(context), request)
