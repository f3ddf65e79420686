"""``LocalTransport``: direct facade calls, with no serialization, no network and no auth."""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine
from typing import Any

from google.protobuf import message

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.transport import CallOptions
from cleveragents.acp.facade.service_facade import ServiceFacade


class LocalTransport:
    def __init__(self, facade: ServiceFacade, *, owns_facade: bool = False) -> None:
        self.facade = facade
        self._owns_facade = owns_facade

    @staticmethod
    def _context(options: CallOptions) -> CallContext:
        return CallContext(
            token=options.token,
            acp_version=options.acp_version,
            request_id=options.request_id,
            ticket=options.ticket,
        )

    def call(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> Coroutine[Any, Any, message.Message]:
        """The facade's own coroutine: no frame of this transport's between caller and facade."""
        return self.facade.invoke(op, request, self._context(options))

    async def open_stream(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> AsyncIterator[message.Message]:
        return await self.facade.stream(op, request, self._context(options))

    async def close(self) -> None:
        if self._owns_facade:
            await self.facade.close()
