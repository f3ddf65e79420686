"""The gRPC server of a real server, driven by grpcio's own client: rich errors, auth,
versions, bad messages, metadata, reflection and health."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from cleveragents.acp.contract import catalog, versions
from cleveragents.acp.contract.errors import ERROR_DOMAIN, grpc_code
from cleveragents.acp.contract.required import required_fields
from cleveragents.acp.v1 import errors_pb2, meta_pb2, session_pb2
from tests.gateway.conftest import MAX_BODY, Served

TIMEOUT = 10


@pytest.fixture
def channel(served: Served) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(served.server.grpc_target) as channel:
        yield channel


def call(
    channel: Any,
    op: catalog.Operation | str,
    request: bytes = b"",
    *,
    token: str | None = None,
    version: str | None = None,
    request_id: str | None = None,
) -> tuple[Any, grpc.Call]:
    """A raw call (bytes in): the response bytes, or the list of stream items."""
    method = op if isinstance(op, str) else op.full_method
    metadata: list[tuple[str, str | bytes]] = []
    if token:
        metadata.append(("authorization", f"Bearer {token}"))
    if version:
        metadata.append(("acp-version", version))
    if request_id:
        metadata.append(("x-request-id", request_id))
    streaming = not isinstance(op, str) and op.server_streaming
    if streaming:
        stream: Any = channel.unary_stream(method, None, None)(
            request, metadata=tuple(metadata), timeout=TIMEOUT
        )
        first = next(iter(stream))
        return first, stream
    unary = channel.unary_unary(method, None, None)
    response, rpc = unary.with_call(request, metadata=tuple(metadata), timeout=TIMEOUT)
    return response, rpc


def acp_error(exc: Any) -> tuple[str, dict[str, str], dict[str, Any]]:
    """The ErrorInfo's reason and metadata, and the exact ACP error, after checking the code."""
    status = rpc_status.from_call(exc)
    assert status is not None, exc
    info = error_details_pb2.ErrorInfo()
    exact = errors_pb2.Error()
    assert status.details[0].Unpack(info)
    assert status.details[1].Unpack(exact)
    assert info.domain == ERROR_DOMAIN
    assert exc.code() == grpc_code(info.reason)
    assert errors_pb2.ErrorCode.Name(exact.code) == info.reason
    assert exact.message == exc.details()
    return info.reason, dict(info.metadata), json_format.MessageToDict(exact.details)


def fails(
    channel: Any, op: catalog.Operation | str, request: bytes = b"", **kwargs: Any
) -> tuple[str, dict[str, str], dict[str, Any]]:
    with pytest.raises(grpc.RpcError) as info:
        call(channel, op, request, **kwargs)
    return acp_error(info.value)


def test_version_needs_no_token(channel: Any) -> None:
    raw, rpc = call(channel, catalog.OPERATIONS["meta.version"], request_id="grpc-1")
    response = meta_pb2.GetVersionResponse.FromString(raw)
    assert list(response.supported_versions) == list(versions.SUPPORTED)
    trailing = dict(rpc.trailing_metadata())
    assert trailing["x-request-id"] == "grpc-1"
    assert trailing["acp-version"] == versions.CURRENT


def test_no_token_is_auth_required_with_the_scheme(channel: Any) -> None:
    """Every operation, every principal: tests/conformance/generated.py (auth.matrix)."""
    reason, metadata, _ = fails(channel, catalog.OPERATIONS["session.list"], token="acp_not-a-token")
    assert (reason, metadata) == ("AUTH_REQUIRED", {"scheme": "Bearer"})


def test_bad_messages(channel: Any, served: Served) -> None:
    create = catalog.OPERATIONS["session.create"]
    reason, metadata, _ = fails(channel, create, b"\xff\xff\xff", token=served.token())
    assert reason == "INVALID_PARAMS"
    assert metadata["field"] == "request"
    unknown_field = b"\xf8\x06\x01"  # field 111, varint 1
    reason, metadata, exact = fails(channel, create, unknown_field, token=served.token())
    assert reason == "INVALID_PARAMS"
    assert "#111" in metadata["unknown_fields"]
    assert exact["unknown_fields"] == ["<request>#111"]
    assert create.request_type.DESCRIPTOR.fields_by_number[1].name == "namespace"
    wrong_type = b"\x08\x01"  # field 1 (a string) sent as a varint
    assert fails(channel, create, wrong_type, token=served.token())[0] == "INVALID_PARAMS"
    huge = session_pb2.CreateSessionRequest(title="x" * (MAX_BODY + 10)).SerializeToString()
    reason, metadata, exact = fails(channel, create, huge, token=served.token())
    assert reason == "INVALID_PARAMS"
    assert exact["max_bytes"] == MAX_BODY


def test_missing_required_fields(channel: Any, served: Served) -> None:
    needy = [op for op in catalog.OPERATIONS.values() if required_fields(op.request_type.DESCRIPTOR)]
    for op in needy[:5]:
        reason, _, exact = fails(channel, op, token=served.token("root"))
        assert reason == "INVALID_PARAMS", op.name
        assert exact["missing_fields"], op.name


def test_unknown_operations(channel: Any) -> None:
    reason, metadata, _ = fails(channel, "/cleveragents.acp.v1.PlanService/Fly")
    assert reason == "NOT_FOUND"
    assert metadata["method"] == "/cleveragents.acp.v1.PlanService/Fly"
    with pytest.raises(grpc.RpcError) as info:
        call(channel, "/other.Service/Method")
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_namespaces(channel: Any, served: Served) -> None:
    create = catalog.OPERATIONS["session.create"]
    request = session_pb2.CreateSessionRequest(namespace="default").SerializeToString()
    reason, metadata, _ = fails(channel, create, request, token=served.token("bob"))
    assert reason == "AUTH_FORBIDDEN"
    assert metadata["namespace"] == "default"
    raw, _ = call(channel, create, request, token=served.token("alice"))
    session_id = session_pb2.CreateSessionResponse.FromString(raw).session.meta.id
    show = catalog.OPERATIONS["session.show"]
    shown = session_pb2.GetSessionRequest(session_id=session_id).SerializeToString()
    reason, metadata, _ = fails(channel, show, shown, token=served.token("bob"))
    assert (reason, metadata.get("refinement")) == ("NOT_FOUND", "SESSION_NOT_FOUND")
    assert "namespace" not in metadata
    listing = catalog.OPERATIONS["session.list"]
    raw, _ = call(
        channel,
        listing,
        session_pb2.ListSessionsRequest(page_size=500).SerializeToString(),
        token=served.token("bob"),
    )
    assert session_id not in [s.meta.id for s in session_pb2.ListSessionsResponse.FromString(raw).sessions]


def test_versions(channel: Any, served: Served) -> None:
    listing = catalog.OPERATIONS["session.list"]
    for version in versions.SUPPORTED:
        _, rpc = call(channel, listing, token=served.token(), version=version)
        assert dict(rpc.trailing_metadata())["acp-version"] == version
    version_op = catalog.OPERATIONS["meta.version"]
    reason, _, exact = fails(channel, version_op, version="1.0")
    assert reason == "VERSION_MISMATCH"
    assert exact["supported_versions"] == list(versions.SUPPORTED)
    # Every operation at every version: tests/conformance/generated.py (version.matrix).
    reason, metadata, _ = fails(channel, version_op, version="2.0")
    assert reason == "VERSION_MISMATCH"
    assert metadata["supported_versions"] == '["1.3","1.2","1.1"]'


def test_stream_admission_errors_come_before_any_item(channel: Any, served: Served) -> None:
    subscribe = catalog.OPERATIONS["events.subscribe"]
    assert fails(channel, subscribe)[0] == "AUTH_REQUIRED"
    bad_filter = subscribe.request_type(event_type=["bogus"]).SerializeToString()
    reason, metadata, _ = fails(channel, subscribe, bad_filter, token=served.token())
    assert reason == "INVALID_PARAMS"
    assert metadata["field"] == "event_type"
    other = subscribe.request_type(namespace="default").SerializeToString()
    assert fails(channel, subscribe, other, token=served.token("bob"))[0] == "AUTH_FORBIDDEN"
    assert fails(channel, subscribe, token=served.token(), version="3.0")[0] == "VERSION_MISMATCH"


def test_subscribe_streams_events(channel: Any, served: Served) -> None:
    create = catalog.OPERATIONS["session.create"]
    raw, _ = call(channel, create, token=served.token())
    session_id = session_pb2.CreateSessionResponse.FromString(raw).session.meta.id
    tell = catalog.OPERATIONS["session.tell"]
    told = session_pb2.TellSessionRequest(session_id=session_id, content="hello").SerializeToString()
    call(channel, tell, told, token=served.token())
    subscribe = catalog.OPERATIONS["events.subscribe"]
    request = subscribe.request_type(session_id=session_id).SerializeToString()
    stream: Any = channel.unary_stream(
        subscribe.full_method, response_deserializer=subscribe.response_type.FromString
    )(request, metadata=[("authorization", f"Bearer {served.token()}")], timeout=TIMEOUT)
    events = [next(stream).event for _ in range(4)]
    stream.cancel()
    # The tell's events at ACP 1.3 (no acp-version metadata: the newest).
    assert [e.type for e in events] == [
        "session.turn_started",
        "session.message",
        "session.message",
        "session.turn_completed",
    ]
    assert events[1].session_message.message.content == "hello"
    assert [e.sequence for e in events] == sorted({e.sequence for e in events})
    assert {e.session_id for e in events} == {session_id}


def test_health_and_reflection(channel: Any) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    assert (
        health.Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT).status
        == health_pb2.HealthCheckResponse.SERVING
    )
    checked = health.Check(
        health_pb2.HealthCheckRequest(service="cleveragents.acp.v1.PlanService"), timeout=TIMEOUT
    )
    assert checked.status == health_pb2.HealthCheckResponse.SERVING
