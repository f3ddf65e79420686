"""Issue 17, finding 9 (gRPC half): a request over the message limit is INVALID_PARAMS with
its details (ErrorInfo and the exact ACP error), not the runtime's bare RESOURCE_EXHAUSTED,
up to the runtime's own cap (GRPC_RUNTIME_FACTOR times the limit)."""

from __future__ import annotations

import grpc
import pytest

from cleveragents.acp.contract import catalog, limits
from cleveragents.acp.gateway.grpc.server import runtime_cap
from cleveragents.acp.v1 import session_pb2
from tests.gateway.test_grpc import call, fails
from tests.security.bounded_server import MAX_BODY, Bounded, bounded  # noqa: F401 - the fixture


def test_requests_over_the_limit_are_invalid_params_with_details(bounded: Bounded) -> None:  # noqa: F811
    create = catalog.OPERATIONS["session.create"]
    token = bounded.tokens.tokens["alice"]
    with grpc.insecure_channel(bounded.server.grpc_target) as channel:
        for size in (MAX_BODY + 10, 2 * MAX_BODY + 1024 * 1024, limits.GRPC_RUNTIME_FACTOR * MAX_BODY):
            huge = session_pb2.CreateSessionRequest(title="x" * size).SerializeToString()
            reason, metadata, exact = fails(channel, create, huge, token=token)
            assert reason == "INVALID_PARAMS", size
            assert metadata["field"] == "request"
            assert exact["max_bytes"] == MAX_BODY
        # Past the runtime's cap (above a whole session.import) the runtime answers by itself
        # (documented).
        past = session_pb2.CreateSessionRequest(title="x" * (runtime_cap(MAX_BODY) + 1024))
        with pytest.raises(grpc.RpcError) as refused:
            call(channel, create, past.SerializeToString(), token=token)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
