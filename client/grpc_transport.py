"""``GrpcTransport``: ACP over gRPC, with generic calls derived from the catalog.

Each operation is called by its wire name (``op.full_method``) with the message classes
of the catalog as (de)serializers, so no generated stub is needed. The token, version and
request id travel as ``authorization``, ``acp-version`` and ``x-request-id`` metadata; a
failed call's ``google.rpc.Status`` becomes the same ``ACPError`` the server raised.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import grpc
from google.protobuf import message

from cleveragents.acp.contract import revisions, rich_status
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError, ErrorCode, TransportError
from cleveragents.acp.contract.retry import RetryPolicy, with_retry
from cleveragents.acp.contract.transport import TICKET_METADATA, CallOptions, StreamItems

CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    # Clients trust the server's replies to be as big as they need (long lists, exports).
    ("grpc.max_receive_message_length", -1),
    # A channel that lost its server tries again within a second (gRPC's default backoff
    # grows to two minutes), so a retried call finds a restarted server soon after it is up.
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# gRPC's words for a call that never left: no connection could be made.
_NOT_SENT_MARKERS = ("failed to connect", "connection refused", "dns resolution failed", "name resolution")


def open_channel(
    target: str,
    *,
    tls: bool = False,
    root_certificates: bytes | None = None,
    options: list[tuple[str, Any]] | None = None,
) -> grpc.aio.Channel:
    """A channel to ``host:port``; TLS when ``tls`` or a CA bundle is given."""
    all_options = [*CHANNEL_OPTIONS, *(options or [])]
    if tls or root_certificates is not None:
        credentials = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        return grpc.aio.secure_channel(target, credentials, options=all_options)
    return grpc.aio.insecure_channel(target, options=all_options)


def error_from_rpc(exc: grpc.aio.AioRpcError) -> ACPError:
    details_bin = None
    for item in exc.trailing_metadata() or ():
        key, value = cast(tuple[str, str | bytes], item)
        if key == rich_status.DETAILS_KEY and isinstance(value, bytes):
            details_bin = value
    error = rich_status.from_status(exc.code(), exc.details() or "", details_bin)
    if isinstance(error, TransportError):
        # Whether the call may have reached the server (retry.py): only gRPC's message says.
        text = f"{exc.details() or ''} {exc.debug_error_string() or ''}".lower()
        error.details["sent"] = not any(marker in text for marker in _NOT_SENT_MARKERS)
    return error


def _serialize(request: message.Message) -> bytes:
    return request.SerializeToString()


class GrpcTransport:
    def __init__(
        self,
        channel: grpc.aio.Channel,
        *,
        owns_channel: bool = False,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> None:
        """``timeout`` bounds each unary call (seconds); streams are unbounded. ``retry``: how
        a call the server never answered is retried (``CallOptions.retry`` overrides it per
        call); ``RetryPolicy.OFF`` never retries."""
        self.channel = channel
        self.timeout = timeout
        self.retry = retry if retry is not None else RetryPolicy()
        self._owns_channel = owns_channel
        self._unary: dict[str, grpc.aio.UnaryUnaryMultiCallable[Any, Any]] = {}
        self._streams: dict[str, grpc.aio.UnaryStreamMultiCallable[Any, Any]] = {}

    @classmethod
    def connect(
        cls,
        target: str,
        *,
        tls: bool = False,
        root_certificates: bytes | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> GrpcTransport:
        channel = open_channel(target, tls=tls, root_certificates=root_certificates)
        return cls(channel, owns_channel=True, timeout=timeout, retry=retry)

    @staticmethod
    def _metadata(options: CallOptions) -> tuple[tuple[str, str], ...]:
        metadata = [("x-request-id", options.request_id)]
        if options.token:
            metadata.append(("authorization", f"Bearer {options.token}"))
        if options.ticket:
            metadata.append((TICKET_METADATA, options.ticket))
        if options.acp_version:
            metadata.append(("acp-version", options.acp_version))
        if options.traceparent:
            metadata.append(("traceparent", options.traceparent))
        if options.if_revision is not None:
            metadata.append((revisions.METADATA, str(options.if_revision)))
        return tuple(metadata)

    async def call(self, op: Operation, request: message.Message, options: CallOptions) -> message.Message:
        """One call; UNAVAILABLE (a ``TransportError``) is retried as the policy allows
        (retry.py), with the same ``x-request-id``."""
        return await with_retry(options.retry or self.retry, op, lambda: self._call(op, request, options))

    async def _call(self, op: Operation, request: message.Message, options: CallOptions) -> message.Message:
        if op.server_streaming:
            raise ACPError(ErrorCode.INVALID_PARAMS, f"{op.name} is a stream; subscribe to it")
        method = self._unary.get(op.full_method)
        if method is None:
            method = self.channel.unary_unary(
                op.full_method,
                request_serializer=_serialize,
                response_deserializer=op.response_type.FromString,
            )
            self._unary[op.full_method] = method
        if options.reply is not None:
            return await self._call_reading_reply(method, request, options)
        try:
            response: message.Message = await method(
                request, metadata=self._metadata(options), timeout=self.timeout
            )
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
        return response

    async def _call_reading_reply(
        self,
        method: grpc.aio.UnaryUnaryMultiCallable[Any, Any],
        request: message.Message,
        options: CallOptions,
    ) -> message.Message:
        """The call, filling ``options.reply`` from the trailing metadata (``acp-replayed``)."""
        assert options.reply is not None
        call = method(request, metadata=self._metadata(options), timeout=self.timeout)
        try:
            response: message.Message = await call
        except grpc.aio.AioRpcError as exc:
            options.reply.replayed = _replayed(exc.trailing_metadata())
            raise error_from_rpc(exc) from None
        options.reply.replayed = _replayed(await call.trailing_metadata())
        return response

    async def open_stream(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> AsyncIterator[message.Message]:
        """Returns once the server has admitted the stream: it sends its initial metadata
        right after admission, and an admission error ends the call before any. A server
        that cannot be reached is retried as for calls."""
        return await with_retry(
            options.retry or self.retry, op, lambda: self._open_stream(op, request, options)
        )

    async def _open_stream(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> AsyncIterator[message.Message]:
        if not op.server_streaming:
            raise ACPError(ErrorCode.INVALID_PARAMS, f"{op.name} is not a stream")
        method = self._streams.get(op.full_method)
        if method is None:
            method = self.channel.unary_stream(
                op.full_method,
                request_serializer=_serialize,
                response_deserializer=op.response_type.FromString,
            )
            self._streams[op.full_method] = method
        call = method(request, metadata=self._metadata(options))
        try:
            initial = await call.initial_metadata()
            admitted = any(key == "acp-version" for key, _ in initial or ())
            if not admitted:
                code = await call.code()
                if code != grpc.StatusCode.OK:
                    trailing = await call.trailing_metadata()
                    details_bin = next(
                        (
                            v
                            for k, v in trailing or ()
                            if k == rich_status.DETAILS_KEY and isinstance(v, bytes)
                        ),
                        None,
                    )
                    raise rich_status.from_status(code, await call.details() or "", details_bin)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
        except BaseException:
            call.cancel()
            raise

        async def release() -> None:
            call.cancel()

        return StreamItems(self._items(call), release)

    @staticmethod
    async def _items(call: grpc.aio.UnaryStreamCall[Any, Any]) -> AsyncIterator[message.Message]:
        try:
            async for item in call:
                yield item
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from None
        finally:
            call.cancel()

    async def close(self) -> None:
        if self._owns_channel:
            await self.channel.close(None)


def _replayed(trailing: Any) -> bool:
    return any(key == "acp-replayed" and value == "true" for key, value in trailing or ())
