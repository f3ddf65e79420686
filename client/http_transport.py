"""``HTTPTransport``: ACP over JSON/HTTP(S), the canonical envelope for calls and SSE for streams.

It takes an ``httpx.AsyncClient`` whose ``base_url`` is the server (``https://host:8080``),
so tests can hand it any real client. Error envelopes become the same ``ACPError`` the
server raised; a failure to reach the server (or a lost connection) is a ``TransportError``
and an answer that is not an envelope an INTERNAL_ERROR, each naming the cause, raised at
this boundary with ``from``.
"""

from __future__ import annotations

import base64
import ssl
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote

import httpx
import orjson
from google.protobuf import descriptor, message

from cleveragents.acp.contract import codec, envelope, sse
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError, ErrorCode, TransportError
from cleveragents.acp.contract.retry import RetryPolicy, with_retry
from cleveragents.acp.contract.transport import CallOptions, StreamItems

ENVELOPE_PATH = "/api/v1/acp"
_FD = descriptor.FieldDescriptor


# Failures before a request left: nothing reached the server, so any call may be retried.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def _causes(exc: BaseException) -> Iterator[BaseException]:
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return
        yield seen
        seen = seen.__cause__ or seen.__context__


def _unreachable(exc: Exception, url: httpx.URL | str) -> TransportError:
    """``details["sent"]``: whether the request may have reached the server (retry.py);
    a certificate the client refuses, or a timeout the caller chose, is not retried."""
    details: dict[str, Any] = {
        "transport": "http",
        "cause": type(exc).__name__,
        "sent": not isinstance(exc, _NOT_SENT),
    }
    if isinstance(exc, httpx.TimeoutException) and not isinstance(exc, _NOT_SENT):
        details["retryable"] = False
    if any(isinstance(cause, ssl.SSLError) for cause in _causes(exc)):
        details["retryable"] = False
    return TransportError(f"cannot reach the ACP server at {url}: {exc}", details)


def _decode_envelope(response: httpx.Response, body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        value = None
    if not isinstance(value, dict) or value.get("status") not in ("ok", "error"):
        raise ACPError(
            ErrorCode.INTERNAL_ERROR,
            f"the server answered HTTP {response.status_code} without an ACP envelope",
            {"transport": "http", "http_status": response.status_code},
        )
    return value


def _query_values(field: descriptor.FieldDescriptor, value: Any) -> list[str]:
    values = list(value) if field.is_repeated else [value]
    if field.type == _FD.TYPE_BOOL:
        return ["true" if v else "false" for v in values]
    if field.type == _FD.TYPE_BYTES:
        return [base64.b64encode(v).decode() for v in values]
    if field.enum_type is not None:
        return [field.enum_type.values_by_number[v].name for v in values]
    return [str(v) for v in values]


def _query(msg: message.Message, prefix: str = "") -> Iterator[tuple[str, str]]:
    """The set fields of a request as query parameters (nested fields dotted)."""
    for field, value in msg.ListFields():
        key = prefix + field.name
        if field.message_type is not None and not field.is_repeated:
            yield from _query(value, key + ".")
        else:
            for item in _query_values(field, value):
                yield key, item


def rest_target(
    op: Operation, request: message.Message
) -> tuple[str, list[tuple[str, str | int | float | bool | None]]]:
    """Path and query of an operation's REST route for a request without a body."""
    path = op.http.path
    pairs = list(_query(request))
    taken = set(op.http.path_params)
    for name in op.http.path_params:
        value: Any = request
        for part in name.split("."):
            value = getattr(value, part)
        path = path.replace(f"{{{name}}}", quote(str(value), safe=""))
    return path, [(key, value) for key, value in pairs if key not in taken]


class HTTPTransport:
    def __init__(
        self, client: httpx.AsyncClient, *, owns_client: bool = False, retry: RetryPolicy | None = None
    ) -> None:
        """``retry``: how a call the server never answered is retried (``CallOptions.retry``
        overrides it per call); ``RetryPolicy.OFF`` never retries."""
        self.client = client
        self.retry = retry if retry is not None else RetryPolicy()
        self._owns_client = owns_client

    @classmethod
    def connect(
        cls,
        base_url: str,
        *,
        verify: bool | str = True,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
    ) -> HTTPTransport:
        """A transport owning its client; ``verify`` is True, False or a CA bundle path."""
        client = httpx.AsyncClient(base_url=base_url, verify=verify, timeout=timeout)
        return cls(client, owns_client=True, retry=retry)

    @staticmethod
    def _headers(options: CallOptions) -> dict[str, str]:
        headers = {"X-Request-ID": options.request_id}
        if options.token:
            headers["Authorization"] = f"Bearer {options.token}"
        if options.acp_version:
            headers["ACP-Version"] = options.acp_version
        if options.traceparent:
            headers["traceparent"] = options.traceparent
        return headers

    async def call(self, op: Operation, request: message.Message, options: CallOptions) -> message.Message:
        """One call; a ``TransportError`` is retried as the policy allows (retry.py), with
        the same request id, so a server that replays by request id does it once."""
        return await with_retry(options.retry or self.retry, op, lambda: self._call(op, request, options))

    async def _call(self, op: Operation, request: message.Message, options: CallOptions) -> message.Message:
        payload: dict[str, Any] = {
            "request_id": options.request_id,
            "operation": op.name,
            "params": codec.to_dict(request),
        }
        if options.acp_version:
            payload["acp_version"] = options.acp_version
        if options.if_revision is not None:
            payload["if_revision"] = options.if_revision
        try:
            response = await self.client.post(
                # Each major has its envelope endpoint under its own prefix (/api/v2/acp).
                ENVELOPE_PATH if op.major == 1 else f"{op.version_table.prefix}/acp",
                content=orjson.dumps(payload),
                headers={**self._headers(options), "Content-Type": "application/json"},
            )
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self.client.base_url) from exc
        if options.reply is not None:
            options.reply.replayed = response.headers.get("acp-replayed") == "true"
        data = envelope.raise_for_error(_decode_envelope(response, response.content))
        return codec.response_from_dict(data, op.response_type)

    async def open_stream(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> AsyncIterator[message.Message]:
        """Admits the stream; a server that cannot be reached is retried as for calls."""
        return await with_retry(
            options.retry or self.retry, op, lambda: self._open_stream(op, request, options)
        )

    async def _open_stream(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> AsyncIterator[message.Message]:
        if not op.server_streaming:
            raise ACPError(ErrorCode.INVALID_PARAMS, f"{op.name} is not a stream")
        if op.http.body:
            raise ACPError(ErrorCode.INVALID_PARAMS, f"{op.name} has no body-less route to stream from")
        path, query = rest_target(op, request)
        http_request = self.client.build_request(
            op.http.method,
            path,
            params=query,
            headers={**self._headers(options), "Accept": "text/event-stream"},
            # A stream may be quiet for long; the server's keep-alive comments show it is alive.
            timeout=httpx.Timeout(self.client.timeout.connect, read=None),
        )
        try:
            response = await self.client.send(http_request, stream=True)
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self.client.base_url) from exc
        if response.status_code != 200 or not response.headers.get("content-type", "").startswith(
            "text/event-stream"
        ):
            try:
                body = await response.aread()
            except httpx.HTTPError as exc:
                raise _unreachable(exc, self.client.base_url) from exc
            finally:
                await response.aclose()
            envelope.raise_for_error(_decode_envelope(response, body))
            raise ACPError(ErrorCode.INTERNAL_ERROR, "the server answered a stream with an envelope")
        return StreamItems(self._items(op, response), response.aclose)

    async def _items(self, op: Operation, response: httpx.Response) -> AsyncIterator[message.Message]:
        parser = sse.Parser()
        try:
            async for line in response.aiter_lines():
                for event in parser.feed(line.rstrip("\r")):
                    data = orjson.loads(event.data)
                    if event.event == sse.ERROR_EVENT:
                        envelope.raise_for_error(data)
                    yield sse.item_from_data(op, data)
        except httpx.HTTPError as exc:
            raise _unreachable(exc, self.client.base_url) from exc
        except orjson.JSONDecodeError as exc:
            raise ACPError(ErrorCode.INTERNAL_ERROR, f"unreadable SSE frame: {exc}") from exc
        finally:
            await response.aclose()

    async def close(self) -> None:
        if self._owns_client:
            await self.client.aclose()
