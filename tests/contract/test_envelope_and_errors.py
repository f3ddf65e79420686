"""The envelope and the error taxonomy have the proto's JSON shape, with proto field names."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf import json_format

from cleveragents.acp.contract import codec, envelope, errors, json_depth, versions
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.v1 import envelope_pb2, errors_pb2, session_pb2

ADR_CODES = {
    "AUTH_REQUIRED": 401,
    "AUTH_FORBIDDEN": 403,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "INVALID_PARAMS": 422,
    "INVALID_STATE": 409,
    "BUDGET_EXCEEDED": 429,
    "VERSION_MISMATCH": 400,
    "INTERNAL_ERROR": 500,
}


def test_error_enum_is_the_adr_taxonomy() -> None:
    names = [v.name for v in errors_pb2.ErrorCode.DESCRIPTOR.values if v.number != 0]
    assert sorted(names) == sorted(ADR_CODES)
    assert set(errors.TABLE) == set(names)
    for name, status in ADR_CODES.items():
        assert errors.http_status(name) == status


def test_grpc_codes() -> None:
    assert errors.grpc_code("AUTH_REQUIRED") is grpc.StatusCode.UNAUTHENTICATED
    assert errors.grpc_code("INVALID_STATE") is grpc.StatusCode.FAILED_PRECONDITION
    assert errors.grpc_code("VERSION_MISMATCH") is grpc.StatusCode.FAILED_PRECONDITION
    assert errors.grpc_code("BUDGET_EXCEEDED") is grpc.StatusCode.RESOURCE_EXHAUSTED
    # The table names each status (grpc is imported when one is asked for): every name is one.
    assert all(isinstance(errors.grpc_code(name), grpc.StatusCode) for name in errors.TABLE)


def test_acp_error_accepts_enum_or_name_and_refuses_others() -> None:
    assert ACPError(ErrorCode.NOT_FOUND, "x").code == "NOT_FOUND"
    assert ACPError("NOT_FOUND", "x", refinement="PLAN_NOT_FOUND").details == {"refinement": "PLAN_NOT_FOUND"}
    with pytest.raises(ValueError, match="not an ACP error code"):
        ACPError("PLAN_NOT_FOUND", "x")


def _roundtrip(msg: Any) -> dict[str, Any]:
    as_json = json_format.MessageToDict(msg, preserving_proto_field_name=True)
    again = json_format.ParseDict(as_json, type(msg)())
    assert again == msg
    return as_json


def test_request_envelope_roundtrips_with_proto_field_names() -> None:
    req = json_format.ParseDict(
        {
            "acp_version": "1.0",
            "request_id": "01HXRCF1AAAAAAAAAAAAAAAAAA",
            "operation": "plan.status",
            "params": {"plan_id": "01HXRCF1"},
            "auth": {"token": "t"},
        },
        envelope_pb2.RequestEnvelope(),
    )
    as_json = _roundtrip(req)
    assert set(as_json) == {"acp_version", "request_id", "operation", "params", "auth"}


@pytest.mark.parametrize("code", sorted(ADR_CODES))
def test_error_envelope_matches_the_proto(code: str) -> None:
    err = ACPError(code, "No plan with ID 01HX", {"refinement": "PLAN_NOT_FOUND"})
    built = envelope.error("1.0", "01HXRCF1AAAAAAAAAAAAAAAAAA", err, 1.5)
    parsed = json_format.ParseDict(built, envelope_pb2.ResponseEnvelope())
    assert errors_pb2.ErrorCode.Name(parsed.error.code) == code
    as_json = _roundtrip(parsed)
    assert as_json["error"]["code"] == code
    assert as_json["data"] is None
    assert as_json["timing"] == {"duration_ms": 1.5}


def test_ok_envelope_matches_the_proto() -> None:
    data = codec.to_dict(session_pb2.GetSessionResponse())
    built = envelope.ok("1.1", "r1", data, 42.0)
    parsed = json_format.ParseDict(built, envelope_pb2.ResponseEnvelope(), ignore_unknown_fields=False)
    assert parsed.status == "ok"
    assert not parsed.HasField("error")
    assert set(built) == {"acp_version", "request_id", "status", "data", "error", "timing"}


def test_codec_prints_defaults_with_proto_names() -> None:
    out = codec.to_dict(session_pb2.ListSessionsResponse(next_page_token="x"))
    assert out == {"sessions": [], "next_page_token": "x"}
    out = codec.to_dict(session_pb2.Session(state=session_pb2.SESSION_STATE_ACTIVE))
    assert out["state"] == "SESSION_STATE_ACTIVE"
    assert out["message_count"] == 0


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ([], "must be a JSON object"),
        ({"session_id": 5}, "invalid params"),
        ({"nope": 1}, "invalid params"),
        ({"session_id": {"a": 1}}, "invalid params"),
    ],
)
def test_codec_refuses_bad_params(params: Any, message: str) -> None:
    with pytest.raises(ACPError, match=message) as info:
        codec.from_dict(params, session_pb2.GetSessionRequest)
    assert info.value.code == "INVALID_PARAMS"


def test_codec_refuses_deep_nesting_without_recursion() -> None:
    deep: Any = {}
    for _ in range(100_000):
        deep = {"a": deep}
    with pytest.raises(ACPError) as info:
        codec.from_dict({"document": deep}, session_pb2.ImportSessionRequest)
    assert info.value.details["max_depth"] == json_depth.MAX_DEPTH


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ([], "envelope"),
        ({}, "operation"),
        ({"operation": 3}, "operation"),
        ({"operation": "a.b", "params": []}, "params"),
        ({"operation": "a.b", "auth": "tok"}, "auth"),
        ({"operation": "a.b", "extra": 1}, "envelope"),
        ({"operation": "a.b", "acp_version": 1}, "acp_version"),
    ],
)
def test_bad_request_envelopes(body: Any, field: str) -> None:
    with pytest.raises(ACPError) as info:
        envelope.parse_request(body)
    assert info.value.code == "INVALID_PARAMS"
    assert info.value.details["field"] == field


def test_an_absent_request_id_is_left_to_the_server() -> None:
    """The gateway makes a call's one id (or takes the header's): parsing makes none."""
    assert envelope.parse_request({"operation": "session.show"}).request_id is None
    assert envelope.parse_request({"operation": "session.show", "request_id": ""}).request_id is None
    assert envelope.parse_request({"operation": "session.show", "request_id": "r-1"}).request_id == "r-1"


def test_client_side_reads_error_back() -> None:
    built = envelope.error("1.1", "r", ACPError("INVALID_STATE", "closed", {"a": 1}), 0)
    with pytest.raises(ACPError) as info:
        envelope.raise_for_error(built)
    assert info.value == ACPError("INVALID_STATE", "closed", {"a": 1})


def test_versions() -> None:
    assert versions.negotiate(None) == versions.CURRENT == "1.3"
    assert versions.negotiate("1.1") == "1.1"
    for unsupported in ("1.0", "2.0", "1.4"):
        with pytest.raises(ACPError) as info:
            versions.negotiate(unsupported)
        assert info.value.code == "VERSION_MISMATCH"
        assert info.value.details["supported_versions"] == ["1.3", "1.2", "1.1"]
    versions.check_operation("1.2", "events.ticket", "1.2")
    versions.check_operation("1.1", "plan.list", "1.1")
    with pytest.raises(ACPError, match=r"introduced in ACP 1\.2"):
        versions.check_operation("1.1", "events.ticket", "1.2")


def test_cli_exit_codes_are_distinct_and_clear_of_usage_codes() -> None:
    codes = [errors.exit_code(name) for name in ADR_CODES]
    assert len(set(codes)) == len(codes)
    assert not {0, 1, 2} & set(codes)
