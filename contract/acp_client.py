"""``ACPClient``: call any ACP operation by name, over any transport, with one behaviour.

``client.call("plan.status", {"plan_id": ...})`` or with a request message;
``client.ops.plan.status(plan_id=...)`` reads the same from the catalog;
``client.subscribe({...})`` yields events; ``client.on({...}, callback)`` hands them to a
callback, resuming after a reconnect (``contract/listening.py``).

It lives in the contract runtime, beside ``Transport``, because both sides use it: the
clients over their transports, the gateway for the routes users add (its ``CallerClient``
calls ACP as the request's caller). ``cleveragents.acp.client.acp_client`` is its
clients' name for it.

The operation called is the one of the major the client's ``acp_version`` names
(``2.0``: ACP 2's ``session.show``); no version, the default major's.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

from google.protobuf import message

from cleveragents.acp.contract import catalog, codec
from cleveragents.acp.contract.catalog import Catalog, Major, Operation
from cleveragents.acp.contract.envelope import new_request_id
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.contract.listening import EventCallback, Filters, Listener, StateCallback
from cleveragents.acp.contract.retry import RetryPolicy
from cleveragents.acp.contract.transport import CallOptions, Transport
from cleveragents.acp.v1 import events_pb2

Params = Mapping[str, Any] | message.Message | None


def resolve(name: str, major: Major | None = None) -> Operation:
    """The operation ``name`` of ``major`` (default: the default major's), or NOT_FOUND."""
    op = (major or catalog.CATALOG.default).operations.get(name)
    if op is None:
        where = "" if major is None or major.number == 1 else f" in ACP {major.number}"
        raise ACPError(ErrorCode.NOT_FOUND, f"unknown operation {name!r}{where}", {"operation": name})
    return op


def in_major(op: Operation, request: message.Message, major: Major) -> tuple[Operation, message.Message]:
    """``op`` and ``request`` as the major ``major`` has them: its operation of the same name,
    the request carried over field by field when that major's request type differs (the
    fields set: a field left at its default, such as a later minor's, is not carried)."""
    if op.major == major.number:
        return op, request
    target = resolve(op.name, major)
    if target.request_type is type(request):
        return target, request
    given = {field.name for field, _ in request.ListFields()}
    carried = {name: value for name, value in codec.to_dict(request).items() if name in given}
    return target, codec.from_dict(carried, target.request_type)


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

        async def call(
            params: Params = None, *, if_revision: int | None = None, **fields: Any
        ) -> message.Message:
            return await self._client.call(op.name, params, if_revision=if_revision, **fields)

        call.__doc__ = op.summary
        return call


class _Operations:
    def __init__(self, client: ACPClient) -> None:
        self._client = client

    def __getattr__(self, group: str) -> _Group:
        if not any(op.group == group for op in catalog.OPERATIONS.values()):
            raise AttributeError(group)
        return _Group(self._client, group)


async def _events_of(items: AsyncIterator[message.Message]) -> AsyncGenerator[events_pb2.Event, None]:
    try:
        async for item in items:
            if not isinstance(item, events_pb2.SubscribeEventsResponse):
                raise ACPError(ErrorCode.INTERNAL_ERROR, f"unexpected stream item {type(item).__name__}")
            yield item.event
    finally:
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()


class ACPClient:
    def __init__(
        self,
        transport: Transport,
        *,
        acp_version: str | None = None,
        token: str | None = None,
        contract: Catalog | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """``contract`` is the catalog whose majors the client may speak (default: the product's);
        ``retry`` overrides the network transport's retry policy (``RetryPolicy.OFF``: none)."""
        self.transport = transport
        self.acp_version = acp_version
        self.token = token
        self.retry = retry
        self.ops = _Operations(self)
        self._contract = contract or catalog.CATALOG
        self._major_of: tuple[str | None, Major] = (None, self._contract.default)

    @property
    def major(self) -> Major:
        """The major ``acp_version`` names (remembered for the version last seen)."""
        version, major = self._major_of
        if version != self.acp_version:
            major = self._contract.major_for(self.acp_version)
            self._major_of = (self.acp_version, major)
        return major

    def _options(self) -> CallOptions:
        return CallOptions(
            acp_version=self.acp_version, token=self.token, request_id=new_request_id(), retry=self.retry
        )

    async def call(
        self, operation: str, params: Params = None, *, if_revision: int | None = None, **fields: Any
    ) -> message.Message:
        """``if_revision``: the revision the caller read of the session or plan the call
        mutates; a stale one is refused with no effect (REVISION_MISMATCH, docs/sessions.md)."""
        major = self.major
        op = major.operations.get(operation) or resolve(operation, major)
        if op.server_streaming:
            raise ACPError(ErrorCode.INVALID_PARAMS, f"{operation} is a stream; use subscribe()")
        options = self._options()
        options.if_revision = if_revision
        return await self.transport.call(op, request_for(op, params, fields), options)

    async def subscribe(self, params: Params = None, **fields: Any) -> AsyncIterator[events_pb2.Event]:
        major = self.major
        op = major.operations.get("events.subscribe") or resolve("events.subscribe", major)
        events = await self.open_events(request_for(op, params, fields))
        try:
            async for event in events:
                yield event
        finally:
            # A subscriber that stops early releases the stream (connection, subscription) now.
            await events.aclose()

    async def open_events(
        self, request: message.Message, *, retry: RetryPolicy | None = None
    ) -> AsyncGenerator[events_pb2.Event, None]:
        """The events of a subscription the server has admitted (an error admitting it, such
        as a wrong token or a server out of reach, is raised here). ``retry`` overrides the
        client's policy for opening it."""
        major = self.major
        op = major.operations.get("events.subscribe") or resolve("events.subscribe", major)
        options = self._options()
        if retry is not None:
            options.retry = retry
        items = await self.transport.open_stream(op, request, options)
        return _events_of(items)

    def on(
        self, filters: Filters, callback: EventCallback, *, on_state: StateCallback | None = None
    ) -> Listener:
        """Hand each event matching ``filters`` (the fields of ``events.subscribe``) to
        ``callback`` from a task of its own, resuming after the last one delivered when the
        connection comes back; ``await handle.stop()`` ends it (``contract/listening.py``)."""
        return Listener(self, filters, callback, on_state)

    async def close(self) -> None:
        await self.transport.close()

    async def __aenter__(self) -> ACPClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
