"""In-process stubs with the call surface of the generated grpc.aio stubs.

``SessionServiceStub(channel)`` code becomes ``local_stub(facade, "SessionService")``
and runs unchanged: ``await stub.GetSession(request)`` returns the response message,
``stub.SubscribeEvents(request)`` is an async iterator.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from google.protobuf import message

from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.envelope import new_request_id
from cleveragents.acp.contract.transport import CallOptions
from cleveragents.acp.facade.service_facade import ServiceFacade


class LocalStub:
    def __init__(self, transport: LocalTransport, service: str, *, acp_version: str | None = None) -> None:
        full = service if "." in service else f"cleveragents.acp.v1.{service}"
        self._ops = {op.method: op for op in catalog.OPERATIONS.values() if op.service == full}
        if not self._ops:
            raise ValueError(f"no ACP service named {service!r}")
        self._transport = transport
        self._acp_version = acp_version

    def _options(self) -> CallOptions:
        return CallOptions(acp_version=self._acp_version, token=None, request_id=new_request_id())

    def __getattr__(self, method: str) -> Callable[[message.Message], Any]:
        try:
            op = self._ops[method]
        except KeyError:
            raise AttributeError(method) from None
        if op.server_streaming:
            return lambda request: self._stream(op, request)

        async def unary(request: message.Message) -> message.Message:
            return await self._transport.call(op, request, self._options())

        return unary

    async def _stream(self, op: Operation, request: message.Message) -> AsyncIterator[message.Message]:
        items = await self._transport.open_stream(op, request, self._options())
        async for item in items:
            yield item


def local_stub(facade: ServiceFacade, service: str, *, acp_version: str | None = None) -> LocalStub:
    return LocalStub(LocalTransport(facade), service, acp_version=acp_version)
