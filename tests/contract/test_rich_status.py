"""ACPError <-> google.rpc.Status: exact round trip, and statuses from outside ACP."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2

from cleveragents.acp.contract import rich_status
from cleveragents.acp.contract.errors import ERROR_DOMAIN, ACPError


def test_round_trip_keeps_code_message_and_details() -> None:
    err = ACPError(
        "INVALID_PARAMS",
        "bad",
        {"field": "x", "max_bytes": 64, "ratio": 0.5, "list": ["a", 1], "nested": {"n": 2}, "none": None},
    )
    status = rich_status.to_status(err)
    assert status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info)
    assert (info.reason, info.domain) == ("INVALID_PARAMS", ERROR_DOMAIN)
    assert info.metadata["field"] == "x"
    assert info.metadata["max_bytes"] == "64"
    back = rich_status.from_status(grpc.StatusCode.INVALID_ARGUMENT, "bad", status.SerializeToString())
    assert back == err
    assert isinstance(back.details["max_bytes"], int)


def test_error_info_alone_is_enough() -> None:
    status = rich_status.to_status(ACPError("NOT_FOUND", "gone", {"id": "1"}, refinement="PLAN_NOT_FOUND"))
    del status.details[1]
    back = rich_status.from_status(grpc.StatusCode.NOT_FOUND, "gone", status.SerializeToString())
    assert back == ACPError("NOT_FOUND", "gone", {"id": "1", "refinement": "PLAN_NOT_FOUND"})


def test_statuses_without_acp_details_map_by_code() -> None:
    unavailable = rich_status.from_status(grpc.StatusCode.UNAVAILABLE, "down", None)
    assert (unavailable.code, unavailable.details) == ("INTERNAL_ERROR", {"grpc_code": "UNAVAILABLE"})
    assert rich_status.from_status(grpc.StatusCode.UNIMPLEMENTED, "", None).code == "NOT_FOUND"
    assert rich_status.from_status(grpc.StatusCode.RESOURCE_EXHAUSTED, "big", b"").code == "INVALID_PARAMS"
    assert rich_status.from_status(grpc.StatusCode.UNAUTHENTICATED, "x", b"\xff\xff").code == "AUTH_REQUIRED"
