"""``RESTTransport``: each call on its operation's REST route (``google.api.http``), so the
REST routes are compared with the envelope, gRPC and in-process calls.

Path variables fill the path; a body-less route gets the set fields as query parameters
(nested and map fields dotted, ``labels.team=a``; repeated fields repeated); a ``body: "*"``
route gets the other fields as a JSON body. A call whose path variable is empty cannot be
written as a route (the URL would name another resource), so it goes to the envelope
endpoint instead: the only calls of a REST run that do not use REST.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote

import httpx
import orjson
from google.protobuf import json_format, message

from cleveragents.acp.client.http_transport import HTTPTransport, _decode_envelope
from cleveragents.acp.contract import codec, envelope
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.transport import CallOptions


def _set_fields(request: message.Message) -> dict[str, Any]:
    return json_format.MessageToDict(request, preserving_proto_field_name=True)


def _query(data: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    for key, value in data.items():
        name = prefix + key
        if isinstance(value, dict):
            yield from _query(value, name + ".")
        elif isinstance(value, list):
            for item in value:
                yield name, _text(item)
        else:
            yield name, _text(value)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class RESTTransport:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self._envelope = HTTPTransport(client)

    async def call(self, op: Operation, request: message.Message, options: CallOptions) -> message.Message:
        data = _set_fields(request)
        path = op.http.path
        for name in op.http.path_params:
            value = data.pop(name, "")
            if not value:
                return await self._envelope.call(op, request, options)
            path = path.replace(f"{{{name}}}", quote(str(value), safe=""))
        headers = HTTPTransport._headers(options)
        if op.http.body:
            response = await self.client.request(
                op.http.method,
                path,
                content=orjson.dumps(data),
                headers={**headers, "Content-Type": "application/json"},
            )
        else:
            response = await self.client.request(
                op.http.method, path, params=list(_query(data)), headers=headers
            )
        result = envelope.raise_for_error(_decode_envelope(response, response.content))
        return codec.response_from_dict(result, op.response_type)

    async def open_stream(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> AsyncIterator[message.Message]:
        return await self._envelope.open_stream(op, request, options)

    async def close(self) -> None:
        await self.client.aclose()
