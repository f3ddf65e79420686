"""The JSON/HTTP gateway's hot paths: the envelope endpoint, REST routes from the catalog,
SSE and health, over a ``Service`` (the seam the gRPC server calls too), as one raw ASGI
endpoint.

In one process the service is the ``ServiceFacade`` itself; in gateway-only mode it is
``upstream.TransportService`` over a gRPC transport to the upstream server. Either way the
gateway only translates: it reads the token, version and request id into a
``CallContext``, binds JSON to the request message, and the facade does every check.

No web framework's routing or validation runs on these paths: the proto descriptors are
the schema, so the endpoint dispatches through a route table built from the catalog, and
every answer (wrong methods, unexpected errors) is an envelope. ``fastapi_app.GatewayApp``
(made by ``fastapi_app.build_app``) is the FastAPI application around it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from google.protobuf.message import Message
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from cleveragents.acp.contract import catalog, codec, envelope, limits, revisions, sse
from cleveragents.acp.contract.call import CallContext, ambiguous_credentials
from cleveragents.acp.contract.catalog import Catalog, Major, Operation
from cleveragents.acp.contract.errors import ACPError, ErrorCode, internal_error
from cleveragents.acp.contract.transport import Service
from cleveragents.acp.gateway import common
from cleveragents.acp.gateway.http import binding
from cleveragents.acp.gateway.http.responses import Answer, Exchange, guarded, send_answer
from cleveragents.acp.gateway.http.routing import Route, RouteTable, route_path
from cleveragents.acp.gateway.http.sse import SSEResponse

log = logging.getLogger(__name__)

_VERSION_HEADER = common.VERSION_HEADER.encode()
_REQUEST_ID_HEADER = common.REQUEST_ID_HEADER.encode()
_IDEMPOTENCY_KEY_HEADER = common.IDEMPOTENCY_KEY_HEADER.encode()
_TRACEPARENT_HEADER = b"traceparent"
_AUTHORIZATION = b"authorization"
_IF_MATCH = b"if-match"
# Says a retried call was answered from the stored first answer (CORS exposes it).
REPLAYED = "ACP-Replayed"


@dataclass(frozen=True)
class GatewaySettings:
    max_body_bytes: int = binding.DEFAULT_MAX_BODY_BYTES
    keepalive_seconds: float = 15.0
    cors_origins: Sequence[str] = ()
    server_build: str = ""


# What ``Gateway.handle`` answers: an envelope ready to send, or a stream.
Answered = Answer | SSEResponse


def _text(value: bytes | None) -> str | None:
    return None if value is None else value.decode("latin-1")


def _bearer(authorization: bytes | list[str] | None) -> str | None:
    """The bearer token of a request's Authorization header: its value, or, when it came
    more than once, the list of its values (AMBIGUOUS_CREDENTIALS)."""
    if authorization is None:
        return None
    if isinstance(authorization, list):
        return common.single_bearer(authorization)
    return common.bearer_token(authorization.decode("latin-1"))


# A browser's EventSource authenticates its stream with ``?ticket=`` (events.ticket).
TICKET_PARAMETER = frozenset({"ticket"})


def _ticket(request: Request, token: str | None) -> str | None:
    """The stream ticket of the query, when there is one (never echoed: it is secret)."""
    given = request.query_params.getlist("ticket")
    if not given:
        return None
    if len(given) > 1:
        raise ambiguous_credentials(f"{len(given)} stream tickets")
    if token is not None:
        raise ambiguous_credentials("a bearer token and a stream ticket")
    return given[0]


def _resume_from(request: Request) -> int | None:
    value = binding.header(request, b"last-event-id")
    if value is None or value.strip() == "":
        return None
    value = value.strip()
    # ASCII digits only: str.isdigit() also takes "²" and other digits int() refuses.
    if not (value.isascii() and value.isdigit()):
        raise binding.invalid("Last-Event-ID must be a sequence number (ASCII digits)", "Last-Event-ID")
    return int(value)


def header_auth_required(limit: int) -> ACPError:
    """AUTH_REQUIRED for a body past the body limit that came without an Authorization header."""
    return ACPError(
        ErrorCode.AUTH_REQUIRED,
        f"a request body past {limit} bytes (a large session.import) must authenticate by header: "
        "send 'Authorization: Bearer TOKEN' (not auth.token in the body, which is read only after "
        "the caller is verified)",
        {"scheme": "Bearer", "max_bytes": limit},
        refinement="HEADER_AUTH_REQUIRED",
    )


class Gateway:
    """The one ASGI endpoint behind every path."""

    def __init__(
        self,
        service: Service,
        settings: GatewaySettings | None = None,
        *,
        closing: asyncio.Event | None = None,
        contract: Catalog | None = None,
    ) -> None:
        self.service = service
        self.settings = settings or GatewaySettings()
        self.closing = closing or asyncio.Event()
        self.contract = contract or catalog.CATALOG
        self.routes = RouteTable(contract=self.contract)
        # session.import may exceed the body limit, up to a whole export document.
        self.large = binding.LargeBodies(limits.import_limit(self.settings.max_body_bytes))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serves any path of the route table (NOT_FOUND envelopes for the others)."""
        await self.serve(None, scope, receive, send)

    async def serve(
        self, found: tuple[Route, dict[str, str]] | None, scope: Scope, receive: Receive, send: Send
    ) -> None:
        """Answers one request; ``found`` is its route when the caller already matched it.

        Whatever is raised before the answer started is an INTERNAL_ERROR envelope, as
        ``EnvelopeGuard`` makes it around other applications (``GatewayApp`` calls this
        without the guard when no user middleware sits in between)."""
        try:
            answer = await self.handle(Request(scope, receive), found)
        except binding.PeerGoneError:
            return
        if isinstance(answer, tuple):
            await send_answer(send, answer)
            return
        stream = answer
        await guarded(
            lambda sending: stream(scope, receive, sending), send, f"{scope['method']} {scope['path']}"
        )

    async def handle(self, request: Request, found: tuple[Route, dict[str, str]] | None = None) -> Answered:
        exchange = Exchange()
        try:
            # The first value of each header, as Starlette's Headers.get finds it.
            raw = request.scope["headers"]
            headers: dict[bytes, Any] = dict(reversed(raw))
            version = headers.get(_VERSION_HEADER)
            if version:
                exchange.acp_version = version.decode("latin-1")
            # Validated when given; made once, when the answer needs it, when not.
            given = headers.get(_REQUEST_ID_HEADER)
            key = headers.get(_IDEMPOTENCY_KEY_HEADER)
            if given is not None or key is not None:
                exchange.request_id = common.given_request_id(_text(given), _text(key))
                exchange.request_id_given = exchange.request_id is not None
            traceparent = headers.get(_TRACEPARENT_HEADER)
            if traceparent is not None:
                exchange.traceparent = traceparent.decode("latin-1")
            route, variables = found or self.routes.match(request.method, route_path(request.scope))
            exchange.version_table = route.version_table
            if len(headers) != len(raw):
                # A header repeats: two Authorization values are refused where the token is read.
                values = binding.header_values(request, _AUTHORIZATION)
                if len(values) > 1:
                    headers[_AUTHORIZATION] = values
            return await self._dispatch(route, variables, request, headers, exchange)
        except ACPError as err:
            return exchange.error_answer(err)
        except binding.PeerGoneError:
            raise
        except Exception as exc:
            return exchange.error_answer(internal_error(exc, f"{request.method} {request.url.path}"))
        finally:
            # A large body's place, held from its reading to its answer.
            self.large.release()

    async def _dispatch(
        self,
        route: Route,
        variables: dict[str, str],
        request: Request,
        headers: dict[bytes, Any],
        exchange: Exchange,
    ) -> Answered:
        if route.op is not None:
            exchange.transport = "rest"
            token = _bearer(headers.get(_AUTHORIZATION))
            if_match = headers.get(_IF_MATCH)
            if if_match is not None:
                exchange.if_revision = revisions.parse_if_match(if_match.decode("latin-1"))
                exchange.if_match = True
            if route.op.server_streaming:
                data = await binding.bind_rest(
                    route.op, request, variables, self.settings.max_body_bytes, skip=TICKET_PARAMETER
                )
                return await self._stream(route.op, data, token, request, exchange)
            large = self.large if route.op.name == limits.IMPORT_OPERATION else None
            op = route.op
            data = await binding.bind_rest(
                op,
                request,
                variables,
                self.settings.max_body_bytes,
                large=large,
                admit=lambda: self._admit_large(op, token, exchange),
            )
            message = await self._request(route.op, data, large=large is not None)
            del data  # a session.import's JSON (3x its text) is not held while it runs
            return await self._call(route.op, message, token, exchange)
        if route.endpoint == "envelope" and route.major is not None:
            return await self._envelope(route.major, request, headers, exchange)
        return await self._health(exchange)

    async def _envelope(
        self, major: Major, request: Request, headers: dict[bytes, Any], exchange: Exchange
    ) -> Answer:
        importing = major.operations.get(limits.IMPORT_OPERATION)
        raw = await binding.read_body(
            request,
            self.settings.max_body_bytes,
            None if importing is None else self.large,
            # Past the body limit only a session.import may go, so that is the caller's check.
            lambda: self._admit_large(
                cast(Operation, importing), _bearer(headers.get(_AUTHORIZATION)), exchange
            ),
        )
        body = await binding.parse_json_sized(raw, self.settings.max_body_bytes)
        parsed = envelope.parse_request(body)
        if len(raw) > self.settings.max_body_bytes and parsed.operation != limits.IMPORT_OPERATION:
            raise binding.over_limit(self.settings.max_body_bytes)
        del raw  # a session.import's text (up to 32 MiB) is not held while it is converted and runs
        exchange.acp_version = parsed.acp_version or exchange.acp_version
        exchange.if_revision = parsed.if_revision
        if parsed.request_id:
            exchange.request_id = common.request_id(parsed.request_id)
            exchange.request_id_given = True
        op = major.operations.get(parsed.operation)
        if op is None:
            raise ACPError(
                ErrorCode.NOT_FOUND,
                f"unknown operation {parsed.operation!r}"
                + ("" if major.number == 1 else f" in ACP {major.number}"),
                {"operation": parsed.operation},
            )
        authorization = headers.get(_AUTHORIZATION)
        header_token = _bearer(authorization)
        if parsed.token and authorization is not None:
            raise ambiguous_credentials("auth.token and an Authorization header")
        token = parsed.token or header_token
        message = await self._request(op, parsed.params, large=op.name == limits.IMPORT_OPERATION)
        del body, parsed  # nor its JSON (3x the text)
        return await self._call(op, message, token, exchange)

    async def _admit_large(self, op: Operation, token: str | None, exchange: Exchange) -> None:
        """The caller of a body past the body limit, verified from its headers before it takes
        one of the process's 2 places (``common.large_requests``), by the facade's own check
        (``admit_caller``): a client with no valid token trickling two large bodies at the
        minimum rate held both for up to ``--body-timeout``. The envelope's ``auth.token`` is
        in the body, unread yet: such a caller is told to send its token in the header."""
        try:
            await self.service.admit_caller(op, self._context(token, exchange))
        except ACPError as err:
            if token is None and err.code == "AUTH_REQUIRED":
                raise header_auth_required(self.settings.max_body_bytes) from None
            raise

    @staticmethod
    def _context(token: str | None, exchange: Exchange) -> CallContext:
        return CallContext(
            token=token,
            acp_version=exchange.acp_version,
            request_id=exchange.ensure_request_id(),
            request_id_given=exchange.request_id_given,
            transport=exchange.transport,
            traceparent=exchange.traceparent,
            if_revision=exchange.if_revision,
        )

    @staticmethod
    async def _request(op: Operation, params: dict[str, Any], *, large: bool = False) -> Message:
        """``large``: a session.import, whose document (up to 32 MiB) becomes a protobuf
        Struct on a worker thread: on the loop it held every other call for seconds."""
        if large:
            return await asyncio.to_thread(codec.from_dict, params, op.request_type)
        return codec.from_dict(params, op.request_type)

    async def _call(self, op: Operation, request: Message, token: str | None, exchange: Exchange) -> Answer:
        ctx = self._context(token, exchange)
        try:
            response = await self.service.invoke(op, request, ctx)
        finally:
            if ctx.reply is not None and ctx.reply.replayed:
                exchange.extra_headers[REPLAYED] = "true"
        exchange.served = ctx.served_version
        if exchange.transport == "rest":
            # The revision of the session or plan the answer carries (none before ACP 1.3:
            # the field is stripped for older clients).
            revision = revisions.carried_revision(response)
            if revision is not None:
                exchange.extra_headers["ETag"] = revisions.etag(revision)
        return exchange.ok_answer(codec.to_dict(response))

    async def _stream(
        self,
        op: Operation,
        params: dict[str, Any],
        token: str | None,
        request: Request,
        exchange: Exchange,
    ) -> SSEResponse:
        ctx = self._context(token, exchange)
        ctx.ticket = _ticket(request, token)
        resume = _resume_from(request)
        if resume is not None and sse.RESUME_FIELD in op.request_type.DESCRIPTOR.fields_by_name:
            params = {**params, sse.RESUME_FIELD: str(resume)}
        message = codec.from_dict(params, op.request_type)
        items = await self.service.stream(op, message, ctx)
        exchange.served = ctx.served_version
        return SSEResponse(
            op,
            items,
            exchange,
            keepalive_seconds=self.settings.keepalive_seconds,
            closing=self.closing,
        )

    async def _health(self, exchange: Exchange) -> Answer:
        op = catalog.OPERATIONS["meta.version"]
        await self.service.invoke(op, op.request_type(), CallContext(request_id=exchange.ensure_request_id()))
        return exchange.ok_answer({"status": "SERVING"})

    def refuse(self, err: ACPError) -> Response:
        return Exchange().error(err)
