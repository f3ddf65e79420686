"""An ``ACPError`` on gRPC: a ``google.rpc.Status`` with rich details, and back.

The status carries the gRPC code of the error table, the message, and two details:

- ``google.rpc.ErrorInfo`` (reason = the ACP code, domain = ``ERROR_DOMAIN``, metadata =
  the details, strings as they are and other values as JSON), for any gRPC client;
- ``cleveragents.acp.v1.Error`` (code, message, details as a ``Struct``), from which ACP
  clients rebuild the exact ``ACPError``. ``Struct`` numbers are doubles, so whole numbers
  come back as ``int`` (details hold counts and sequences, not whole-valued floats).

The server side packs with ``to_status``; every gRPC client unpacks with ``from_status``
(UNAVAILABLE without ACP details, the runtime's "cannot connect", is a ``TransportError``).
"""

from __future__ import annotations

from typing import Any

import grpc
import orjson
from google.protobuf import json_format, struct_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from cleveragents.acp.contract.errors import (
    ERROR_DOMAIN,
    TABLE,
    ACPError,
    ErrorCode,
    TransportError,
    grpc_code,
)
from cleveragents.acp.v1 import errors_pb2

DETAILS_KEY = "grpc-status-details-bin"

# A status without ACP details (a proxy, the gRPC runtime itself) maps by its code.
_BY_GRPC_CODE: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.UNAUTHENTICATED: "AUTH_REQUIRED",
    grpc.StatusCode.PERMISSION_DENIED: "AUTH_FORBIDDEN",
    grpc.StatusCode.NOT_FOUND: "NOT_FOUND",
    grpc.StatusCode.UNIMPLEMENTED: "NOT_FOUND",
    grpc.StatusCode.ALREADY_EXISTS: "ALREADY_EXISTS",
    grpc.StatusCode.INVALID_ARGUMENT: "INVALID_PARAMS",
    # The runtime's "message larger than max" is a bad request, not a spent budget.
    grpc.StatusCode.RESOURCE_EXHAUSTED: "INVALID_PARAMS",
    grpc.StatusCode.FAILED_PRECONDITION: "INVALID_STATE",
}


def jsonable(details: dict[str, Any]) -> dict[str, Any]:
    """Details as plain JSON values (tuples become lists, odd objects their ``str``)."""
    value = orjson.loads(orjson.dumps(details, default=str, option=orjson.OPT_NON_STR_KEYS))
    return value if isinstance(value, dict) else {}


def _metadata_value(value: Any) -> str:
    return value if isinstance(value, str) else orjson.dumps(value).decode()


def to_status(err: ACPError) -> status_pb2.Status:
    details = jsonable(err.details)
    info = error_details_pb2.ErrorInfo(
        reason=err.code,
        domain=ERROR_DOMAIN,
        metadata={key: _metadata_value(value) for key, value in details.items()},
    )
    exact = errors_pb2.Error(code=ErrorCode.Value(err.code), message=err.message)
    exact.details.update(details)
    status = status_pb2.Status(code=grpc_code(err.code).value[0], message=err.message)
    status.details.add().Pack(info)
    status.details.add().Pack(exact)
    return status


def _whole_numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: _whole_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(item) for item in value]
    return value


def _struct_dict(struct: struct_pb2.Struct) -> dict[str, Any]:
    value = _whole_numbers(json_format.MessageToDict(struct))
    return value if isinstance(value, dict) else {}


def from_status(code: grpc.StatusCode, message: str, details_bin: bytes | None) -> ACPError:
    """The ``ACPError`` a failed call carries, remembering the status it came with (so the
    contract suite can hold that to the error table); a status without ACP details maps by code."""
    error = _from_status(code, message, details_bin)
    error.grpc_status = code.name
    return error


def _from_status(code: grpc.StatusCode, message: str, details_bin: bytes | None) -> ACPError:
    info = None
    if details_bin:
        try:
            status = status_pb2.Status.FromString(details_bin)
        except DecodeError:
            status = status_pb2.Status()
        for item in status.details:
            if item.Is(errors_pb2.Error.DESCRIPTOR):
                exact = errors_pb2.Error()
                item.Unpack(exact)
                if exact.code in ErrorCode.values() and ErrorCode.Name(exact.code) in TABLE:
                    return ACPError(exact.code, exact.message, _struct_dict(exact.details))
            elif item.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                candidate = error_details_pb2.ErrorInfo()
                item.Unpack(candidate)
                if candidate.domain == ERROR_DOMAIN and candidate.reason in TABLE:
                    info = candidate
    if info is not None:
        return ACPError(info.reason, message, dict(info.metadata))
    if code == grpc.StatusCode.UNAVAILABLE:
        # The runtime's own status for a server it cannot reach or lost: no ACP server said it.
        return TransportError(message or code.name, {"grpc_code": code.name})
    acp_code = _BY_GRPC_CODE.get(code, "INTERNAL_ERROR")
    return ACPError(acp_code, message or code.name, {"grpc_code": code.name})
