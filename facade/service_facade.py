"""``ServiceFacade``: the one entry point every transport calls.

It dispatches an operation of the catalog through the handler table (``handlers.table``)
and runs, once for every transport, the checks no wire may skip: authentication, version
gating, required fields, and the mapping of unexpected faults to INTERNAL_ERROR with a
correlation id. Authorization is the domain's, on the call's ``CallContext``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Protocol, cast

from google.protobuf import message

from cleveragents.acp.contract import surface
from cleveragents.acp.contract.call import LOCAL_PRINCIPAL, CallContext, Principal
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError, ErrorCode, internal_error
from cleveragents.acp.contract.limits import check_bounds
from cleveragents.acp.contract.required import check_required
from cleveragents.acp.facade.handlers.table import Handler, Streaming, Unary

log = logging.getLogger(__name__)


class Authenticator(Protocol):
    """Turns a bearer token into a principal, or raises AUTH_REQUIRED."""

    def authenticate(self, token: str | None) -> Principal: ...


class TicketRedeemer(Protocol):
    """Turns a stream ticket into the principal it opens ``request`` for, using it up."""

    def redeem(self, ticket: str, operation: str, request: object) -> Principal: ...


class Closeable(Protocol):
    async def close(self) -> None: ...


class ServiceFacade:
    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        authenticator: Authenticator | None = None,
        tickets: TicketRedeemer | None = None,
        resources: Iterable[Closeable] = (),
    ) -> None:
        """``handlers`` is a table from ``handlers.table.build``, checked against the catalog."""
        self.authenticator = authenticator
        self.tickets = tickets
        self._resources = list(resources)
        self._handlers: dict[str, Handler] = dict(handlers)

    @property
    def served_operations(self) -> frozenset[str]:
        return frozenset(self._handlers)

    def _admit(self, op: Operation, request: message.Message, ctx: CallContext) -> Handler:
        if ctx.ticket is not None:
            ctx.principal = self._redeem(op, request, ctx)
        elif op.anonymous:
            ctx.principal = ctx.principal or LOCAL_PRINCIPAL
        elif self.authenticator is None:
            ctx.principal = LOCAL_PRINCIPAL
        else:
            ctx.principal = self.authenticator.authenticate(ctx.token)
        table = op.version_table
        ctx.served_version = table.negotiate(ctx.acp_version)
        table.check_operation(ctx.served_version, op.name, op.since)
        if not isinstance(request, op.request_type):
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                f"{op.name} takes {op.request_type.DESCRIPTOR.full_name}, not {type(request).__name__}",
            )
        if ctx.served_version != table.current:
            surface.check_request(request, ctx.served_version)
        check_required(request)
        check_bounds(request)
        handler = self._handlers.get(op.key)
        if handler is None:
            raise ACPError(
                ErrorCode.NOT_FOUND,
                f"operation {op.name} is not served by this server",
                {"operation": op.name},
            )
        return handler

    def _redeem(self, op: Operation, request: message.Message, ctx: CallContext) -> Principal:
        if ctx.token is not None:
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                "give a bearer token or a stream ticket, not both",
                {"field": "ticket"},
            )
        if self.tickets is None:
            raise ACPError(
                ErrorCode.AUTH_REQUIRED, "this server issues no stream tickets", {"scheme": "Bearer"}
            )
        return self.tickets.redeem(ctx.ticket or "", op.name, request)

    async def invoke(self, op: Operation, request: message.Message, ctx: CallContext) -> message.Message:
        if op.server_streaming:
            raise ACPError(ErrorCode.INVALID_PARAMS, f"{op.name} is a stream; subscribe to it")
        handler = cast(Unary, self._admit(op, request, ctx))
        try:
            response = await handler(request, ctx)
        except ACPError:
            raise
        except Exception as exc:
            raise internal_error(exc, op.name) from exc
        if ctx.served_version != op.version_table.current:
            return surface.strip(response, ctx.served_version)
        return response

    async def stream(
        self, op: Operation, request: message.Message, ctx: CallContext
    ) -> AsyncIterator[message.Message]:
        """Admission happens before the first item, so early errors surface before any
        response headers are sent."""
        if not op.server_streaming:
            raise ACPError(ErrorCode.INVALID_PARAMS, f"{op.name} is not a stream")
        handler = cast(Streaming, self._admit(op, request, ctx))
        try:
            items = handler(request, ctx)
        except ACPError:
            raise
        except Exception as exc:
            raise internal_error(exc, op.name) from exc
        return self._guarded(items, op, ctx.served_version)

    @staticmethod
    async def _guarded(
        items: AsyncIterator[message.Message], op: Operation, version: str
    ) -> AsyncIterator[message.Message]:
        """Items as the client's version may see them; faults as INTERNAL_ERROR."""
        where = op.name
        older = version != op.version_table.current
        try:
            async for item in items:
                yield surface.strip(item, version) if older else item
        except ACPError:
            raise
        except Exception as exc:
            raise internal_error(exc, where) from exc

    async def close(self) -> None:
        for resource in reversed(self._resources):
            await resource.close()
