"""The gRPC server: every catalog operation served by one unary and one stream wrapper.

Handlers are generic (built from the catalog, never per operation) and take the raw
request bytes, so a malformed or oversized message is an INVALID_PARAMS in the ACP form
instead of the runtime's own error. The wrappers read the credentials, version and request
id from the metadata into a ``CallContext`` and hand the call to the facade through the
``Service`` seam the HTTP gateway calls too; it does every check. An ``ACPError`` goes back
as a ``google.rpc.Status`` (``rich_status``). Unknown methods of an ACP package answer
NOT_FOUND the same way. Reflection and health are on. Every major of the catalog is served,
each under its own package (``cleveragents.acp.v1``, ``cleveragents.acp.v2``).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import operator
import socket
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
from google.protobuf import descriptor, message, unknown_fields
from google.protobuf.message import DecodeError
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer

from cleveragents.acp.contract import catalog, limits, revisions, rich_status, versions
from cleveragents.acp.contract.call import CallContext, ambiguous_credentials
from cleveragents.acp.contract.catalog import Catalog, Operation
from cleveragents.acp.contract.errors import ACPError, ErrorCode, grpc_code, internal_error
from cleveragents.acp.contract.transport import TICKET_METADATA, Service
from cleveragents.acp.gateway import common
from cleveragents.acp.gateway.grpc import connections
from cleveragents.acp.gateway.grpc.connections import ConnectionGuard
from cleveragents.acp.gateway.streams import Tick, until_stopped

Metadata = tuple[tuple[str, str | bytes], ...]
DEFAULT_MAX_MESSAGE_BYTES = limits.DEFAULT_MAX_BODY_BYTES


def runtime_cap(max_message_bytes: int) -> int:
    """The gRPC runtime's own receive cap, far above ours (and above a session.import's), so
    a request over our limit gets our INVALID_PARAMS with details. The runtime buffers a
    whole message before any handler runs, so it cannot be unbounded: past this cap it
    answers its own bare RESOURCE_EXHAUSTED (docs/server.md, "Limits")."""
    ours = max(limits.GRPC_RUNTIME_FACTOR * max_message_bytes, limits.import_limit(max_message_bytes))
    return ours + 1024 * 1024


def _identity(data: bytes) -> bytes:
    return data


# A C-level call per answer (gRPC calls the serializer with the handler's response).
_serialize: Callable[[message.Message], bytes] = operator.methodcaller("SerializeToString")


@functools.cache
def _has_message_fields(desc: descriptor.Descriptor) -> bool:
    """Whether a message of this type can hold other messages (read once per type): a flat
    request needs no ``ListFields`` walk."""
    return any(field.message_type is not None for field in desc.fields)


def _holds_unknown(msg: message.Message) -> bool:
    """Whether the message holds fields this server does not know, anywhere in it; drops
    them. Three C calls: an ``UnknownFieldSet`` per message costs 25 times the parse."""
    size = msg.ByteSize()
    msg.DiscardUnknownFields()
    return msg.ByteSize() != size


def _unknown_fields(msg: message.Message, path: str = "") -> list[str]:
    """Paths of fields this server does not know, anywhere in the message."""
    unknown = unknown_fields.UnknownFieldSet(msg)
    found = [f"{path or '<request>'}#{unknown[i].field_number}" for i in range(len(unknown))]
    if not _has_message_fields(msg.DESCRIPTOR):
        return found
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        where = f"{path}.{field.name}" if path else field.name
        if field.message_type.GetOptions().map_entry:
            values = [v for v in value.values() if isinstance(v, message.Message)]
        elif field.is_repeated:
            values = list(value)
        else:
            values = [value]
        for item in values:
            found += _unknown_fields(item, where)
    return found


class GrpcHandlers:
    """The shared wrappers, and the generic handlers that route every operation to them."""

    def __init__(
        self,
        facade: Service,
        *,
        closing: asyncio.Event,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        contract: Catalog | None = None,
        guard: ConnectionGuard | None = None,
    ) -> None:
        self._facade = facade
        self._guard = guard
        self._closing = closing
        self._max_bytes = max_message_bytes
        self._import_bytes = limits.import_limit(max_message_bytes)
        self._contract = contract or catalog.CATALOG

    def _context(self, metadata: Metadata | None) -> CallContext:
        """One pass over the metadata; of a key sent twice the last value counts, except
        credentials, which must come once."""
        bearers: list[str] = []
        tickets: list[str] = []
        version = given = traceparent = if_revision = None
        for key, value in metadata or ():
            if not isinstance(value, str):
                continue
            if key == "authorization":
                bearers.append(value)
            elif key == TICKET_METADATA:
                tickets.append(value)
            elif key == common.VERSION_HEADER:
                version = value
            elif key == common.REQUEST_ID_HEADER:
                given = value
            elif key == "traceparent":
                traceparent = value
            elif key == revisions.METADATA:
                if_revision = value
        if len(tickets) > 1:
            raise ambiguous_credentials(f"{len(tickets)} stream tickets")
        return CallContext(
            token=common.single_bearer(bearers),
            ticket=tickets[0] if tickets and tickets[0] else None,
            acp_version=version or None,
            request_id=common.request_id(given),
            request_id_given=bool(given),
            transport="grpc",
            traceparent=traceparent,
            if_revision=None if if_revision is None else revisions.parse_metadata(if_revision),
        )

    def _decode(self, op: Operation, data: bytes) -> message.Message:
        if len(data) > self._max_bytes:
            limit = self._import_bytes if op.name == limits.IMPORT_OPERATION else self._max_bytes
            if len(data) > limit:
                raise ACPError(
                    ErrorCode.INVALID_PARAMS,
                    f"the request is {len(data)} bytes; the limit is {limit}",
                    {"field": "request", "max_bytes": limit},
                )
        try:
            request = op.request_type.FromString(data)
        except DecodeError:
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                f"the request is not a valid {op.request_type.DESCRIPTOR.full_name}",
                {"field": "request", "message_type": op.request_type.DESCRIPTOR.full_name},
            ) from None
        if _holds_unknown(request):
            unknown = _unknown_fields(op.request_type.FromString(data))
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                f"unknown fields in {op.request_type.DESCRIPTOR.full_name}: {', '.join(unknown)}",
                {"field": "request", "unknown_fields": unknown},
            )
        return request

    @staticmethod
    def _trailers(ctx: CallContext | None, op: Operation | None) -> Metadata:
        if ctx is None:
            return ()
        version = ctx.served_version or common.served_version(
            ctx.acp_version, op.version_table if op is not None else versions.V1
        )
        if ctx.replayed:
            return (
                (common.REQUEST_ID_HEADER, ctx.request_id),
                (common.VERSION_HEADER, version),
                (common.REPLAYED_HEADER, "true"),
            )
        return ((common.REQUEST_ID_HEADER, ctx.request_id), (common.VERSION_HEADER, version))

    async def _abort(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        err: ACPError,
        ctx: CallContext | None,
        op: Operation | None = None,
    ) -> NoReturn:
        status = rich_status.to_status(err)
        trailers = ((rich_status.DETAILS_KEY, status.SerializeToString()), *self._trailers(ctx, op))
        await context.abort(grpc_code(err.code), err.message, trailers)

    def _saw(
        self, op: Operation, ctx: CallContext | None, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """Tell the connection guard this connection carries a caller's calls once one was
        authenticated (the facade set its principal): the room the guard keeps is for them.
        Counted before, a call with no token (or of ``meta.version``) exempted its connection
        from the per-client cap and the room-keeping sweep."""
        if self._guard is not None and ctx is not None and ctx.principal is not None and not op.anonymous:
            self._guard.saw(context.peer())

    async def unary(
        self, op: Operation, metadata: Metadata, data: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> message.Message:
        """``metadata``: the call's, as gRPC gave it to ``_Routes.service``."""
        ctx: CallContext | None = None
        places = None
        try:
            ctx = self._context(metadata)
            if len(data) > self._max_bytes:
                places = await self._large_place(op, ctx)
            response = await self._facade.invoke(op, self._decode(op, data), ctx)
        except ACPError as err:
            self._saw(op, ctx, context)
            await self._abort(context, err, ctx, op)
        except Exception as exc:
            await self._abort(context, internal_error(exc, op.name), ctx, op)
        finally:
            if places is not None:
                places.release()
        self._saw(op, ctx, context)
        context.set_trailing_metadata(self._trailers(ctx, op))
        return response

    async def _large_place(self, op: Operation, ctx: CallContext) -> asyncio.Semaphore | None:
        """One of the process's places for a request past the message limit (a
        session.import; ``common.large_requests``, shared with HTTP), taken before decoding
        and only once the facade has verified the caller (``admit_caller``): a client with no
        valid token sending 29 MiB messages otherwise held the places and got legitimate
        imports refused. When none is free, it is refused rather than waited for: gRPC holds
        the whole message already, and eight 29 MiB imports held at once took the server to
        3.1 GiB."""
        if op.name != limits.IMPORT_OPERATION:
            return None
        await self._facade.admit_caller(op, ctx)
        places = common.large_requests()
        if places.locked():
            raise ACPError(
                ErrorCode.BUDGET_EXCEEDED,
                f"the server is importing {limits.MAX_LARGE_BODIES} large sessions; retry in a moment",
                {"max_concurrent": limits.MAX_LARGE_BODIES, "retry_after_seconds": 1},
                refinement="TOO_MANY_IMPORTS",
            )
        await places.acquire()  # not locked: taken at once, without a turn of the loop
        return places

    async def stream(
        self, op: Operation, metadata: Metadata, data: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[message.Message]:
        """Initial metadata goes out once the stream is admitted: clients wait for it to
        tell an admission error from a stream that has no item yet."""
        ctx: CallContext | None = None
        try:
            ctx = self._context(metadata)
            items = await self._facade.stream(op, self._decode(op, data), ctx)
        except ACPError as err:
            self._saw(op, ctx, context)
            await self._abort(context, err, ctx, op)
        except Exception as exc:
            await self._abort(context, internal_error(exc, op.name), ctx, op)
        self._saw(op, ctx, context)
        await context.send_initial_metadata(self._trailers(ctx, op))
        try:
            async for item in until_stopped(items, [self._closing]):
                if not isinstance(item, Tick):
                    yield item
        except ACPError as err:
            await self._abort(context, err, ctx, op)
        except Exception as exc:
            await self._abort(context, internal_error(exc, op.name), ctx, op)

    async def unknown(self, method: str, context: grpc.aio.ServicerContext[Any, Any]) -> NoReturn:
        await self._abort(
            context,
            ACPError(ErrorCode.NOT_FOUND, f"unknown operation {method!r}", {"method": method}),
            None,
        )

    def _route(self, op: Operation) -> _Route:
        # A partial of the coroutine function, not a wrapping coroutine: one frame less per
        # call (gRPC still sees a coroutine function).
        serve = GrpcHandlers.stream if op.server_streaming else GrpcHandlers.unary
        return op.server_streaming, functools.partial(serve, self, op)

    def generic_handlers(self) -> list[grpc.GenericRpcHandler[Any, Any]]:
        """One handler for every operation of the catalog and NOT_FOUND for any other method
        of an ACP package: gRPC asks each generic handler in turn, so one per service cost a
        call per service on every call."""
        table = {op.full_method: self._route(op) for op in self._contract.operations()}
        packages = tuple(f"/{major.package}." for major in self._contract.majors.values())
        return [_Routes(table, self.unknown, packages)]


if TYPE_CHECKING:
    _GenericRpcHandler = grpc.GenericRpcHandler[Any, Any]
    _RpcMethodHandler = grpc.RpcMethodHandler[Any, Any]
else:
    _GenericRpcHandler = grpc.GenericRpcHandler
    _RpcMethodHandler = grpc.RpcMethodHandler

# Whether the operation streams, and its wrapper with the operation bound.
_Route = tuple[bool, Callable[..., Any]]


class _CallHandler(
    collections.namedtuple(
        "_CallHandler",
        (
            "request_streaming",
            "response_streaming",
            "request_deserializer",
            "response_serializer",
            "unary_unary",
            "unary_stream",
            "stream_unary",
            "stream_stream",
        ),
    ),
    _RpcMethodHandler,
):
    """One call's method handler (what ``grpc.unary_unary_rpc_method_handler`` makes, as a
    tuple made in one step). No deserializer: the raw bytes come in."""


class _Routes(_GenericRpcHandler):
    """The catalog's methods by wire name; an unknown method of an ACP package answers the
    ACP NOT_FOUND, any other method is left to the other handlers (reflection, health) and
    else to gRPC's UNIMPLEMENTED, which clients probe (reflection v1).

    gRPC asks for a handler per call, with the call's metadata already read into Python
    objects: each call gets a handler holding that metadata, as the wrapper's argument.
    ``context.invocation_metadata()`` would read it a second time, 1.5-3 µs for two keys."""

    def __init__(
        self,
        table: dict[str, _Route],
        answer: Callable[[str, grpc.aio.ServicerContext[Any, Any]], Any],
        packages: tuple[str, ...],
    ) -> None:
        self._table = table
        self._answer = answer
        self._packages = packages

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method
        route = self._table.get(method)
        if route is not None:
            streaming, serve = route
            call = functools.partial(serve, handler_call_details.invocation_metadata)
            if streaming:
                return _CallHandler(False, True, None, _serialize, None, call, None, None)
            return _CallHandler(False, False, None, _serialize, call, None, None, None)
        if not method.startswith(self._packages):
            return None

        async def behaviour(data: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> NoReturn:
            await self._answer(method, context)
            raise AssertionError("abort returned")

        return grpc.unary_unary_rpc_method_handler(
            behaviour,
            request_deserializer=_identity,
            response_serializer=_identity,
        )


def service_names(contract: Catalog | None = None) -> list[str]:
    return sorted({op.service for op in (contract or catalog.CATALOG).operations()})


def build_server(
    facade: Service,
    *,
    closing: asyncio.Event,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    reuse_port: bool = False,
    guard: ConnectionGuard | None = None,
) -> tuple[grpc.aio.Server, HealthServicer]:
    """A grpc.aio server with the ACP services, reflection and health; no port bound yet.
    ``reuse_port``: a worker sharing its port with the other workers of one server.
    ``guard``: the connection policy (``connections``), told of every call's peer."""
    handlers = GrpcHandlers(facade, closing=closing, max_message_bytes=max_message_bytes, guard=guard)
    server = grpc.aio.server(
        options=[
            # A leftover server on the same port must make this one fail, not share its traffic.
            ("grpc.so_reuseport", 1 if reuse_port else 0),
            ("grpc.max_receive_message_length", runtime_cap(max_message_bytes)),
            ("grpc.max_send_message_length", -1),
            *([] if guard is None else connections.options(guard.bounds)),
        ]
    )
    server.add_generic_rpc_handlers(handlers.generic_handlers())
    health_servicer = HealthServicer()
    generic = _GenericOnly(server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, generic)
    names = [*service_names(), health.SERVICE_NAME, reflection.SERVICE_NAME]
    reflecting = ReflectionServicer(names)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(reflecting, generic)
    return server, health_servicer


class _GenericOnly:
    """What a generated ``add_*Servicer_to_server`` is given for health and reflection: it
    keeps their generic handlers and drops the registered-method copies. grpc.aio's accept
    loop keeps one pending request per registered method and waits on all of them
    (``asyncio.wait``) for every incoming call, ours included: 4 more futures to arm and
    disarm per ACP call."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_generic_rpc_handlers(self, handlers: tuple[grpc.GenericRpcHandler[Any, Any], ...]) -> None:
        self._server.add_generic_rpc_handlers(handlers)

    def add_registered_method_handlers(
        self, service_name: str, handlers: dict[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        """Served by the generic handler the same call added."""


async def mark_serving(health_servicer: HealthServicer, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    for name in ["", *service_names()]:
        await health_servicer.set(name, status)


def _probe(address: str) -> None:
    """Refuse a port another process listens on before gRPC tries it: its C core logs its
    own line to stderr (``add_port.cc ... Failed to add port``) when the bind fails."""
    host, _, port = address.rpartition(":")
    if port == "0":
        return
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            host.strip("[]"), int(port), type=socket.SOCK_STREAM
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(where)
    except OSError as exc:
        raise OSError(f"cannot listen for gRPC on {address}: {exc.strerror or exc}") from None


def bind(
    server: grpc.aio.Server, address: str, credentials: grpc.ServerCredentials | None, *, probe: bool = True
) -> int:
    """Bind ``host:port``; the bound port (``0`` asks for an ephemeral one). ``probe``: refuse
    a port in use first (a worker skips it: its parent holds the port for the workers)."""
    if probe:
        _probe(address)
    try:
        port = (
            server.add_secure_port(address, credentials)
            if credentials is not None
            else server.add_insecure_port(address)
        )
    except RuntimeError as exc:
        raise OSError(f"cannot listen for gRPC on {address}: {exc}") from None
    if port == 0:
        raise OSError(f"cannot listen for gRPC on {address}: address in use or not available")
    return port
