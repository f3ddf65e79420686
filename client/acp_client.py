"""``ACPClient``: call any ACP operation by name, over any transport, with one behaviour.

``client.call("plan.status", {"plan_id": ...})`` or with a request message;
``client.ops.plan.status(plan_id=...)`` reads the same from the catalog;
``client.subscribe({...})`` yields events.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from google.protobuf import message

from cleveragents.acp.contract import catalog, codec
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.envelope import new_request_id
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.contract.transport import CallOptions, Transport
from cleveragents.acp.v1 import events_pb2

Params = Mapping[str, Any] | message.Message | None


def resolve(name: str) -> Operation:
    op = catalog.get(name)
    if op is None:
        raise ACPError(ErrorCode.NOT_FOUND, f"unknown operation {name!r}", {"operation": name})
    return op


def request_for(op: Operation, params: Params, fields: Mapping[str, Any]) -> message.Message:
    if isinstance(params, message.Message):
        if fields:
            raise ACPError(ErrorCode.INVALID_PARAMS, "pass either a request message or keyword fields")
        return params
    merged = {**params, **fields} if params else fields
    return codec.from_dict(merged, op.request_type)


class _Group:
    def __init__(self, client: ACPClient, group: str) -> None:
        self._client = client
        self._group = group

    def __getattr__(self, verb: str) -> Any:
        op = resolve(f"{self._group}.{verb}")

        async def call(params: Params = None, **fields: Any) -> message.Message:
            return await self._client.call(op.name, params, **fields)

        call.__doc__ = op.summary
        return call


class _Operations:
    def __init__(self, client: ACPClient) -> None:
        self._client = client

    def __getattr__(self, group: str) -> _Group:
        if not any(op.group == group for op in catalog.OPERATIONS.values()):
            raise AttributeError(group)
        return _Group(self._client, group)


class ACPClient:
    def __init__(
        self, transport: Transport, *, acp_version: str | None = None, token: str | None = None
    ) -> None:
        self.transport = transport
        self.acp_version = acp_version
        self.token = token
        self.ops = _Operations(self)

    def _options(self) -> CallOptions:
        return CallOptions(acp_version=self.acp_version, token=self.token, request_id=new_request_id())

    async def call(self, operation: str, params: Params = None, **fields: Any) -> message.Message:
        op = catalog.OPERATIONS.get(operation) or resolve(operation)
        if op.server_streaming:
            raise ACPError(ErrorCode.INVALID_PARAMS, f"{operation} is a stream; use subscribe()")
        return await self.transport.call(op, request_for(op, params, fields), self._options())

    async def subscribe(self, params: Params = None, **fields: Any) -> AsyncIterator[events_pb2.Event]:
        op = resolve("events.subscribe")
        items = await self.transport.open_stream(op, request_for(op, params, fields), self._options())
        try:
            async for item in items:
                if not isinstance(item, events_pb2.SubscribeEventsResponse):
                    raise ACPError(ErrorCode.INTERNAL_ERROR, f"unexpected stream item {type(item).__name__}")
                yield item.event
        finally:
            # A subscriber that stops early releases the stream (connection, subscription) now.
            aclose = getattr(items, "aclose", None)
            if aclose is not None:
                await aclose()

    async def close(self) -> None:
        await self.transport.close()

    async def __aenter__(self) -> ACPClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
