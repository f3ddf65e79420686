"""The gRPC status is in the trace: an error that crossed gRPC keeps the status it came
with, and one that did not gets the error table's, so a gRPC server answering another
status than the table says makes the gRPC trace differ (issue 18, item 11)."""

from __future__ import annotations

import grpc

from cleveragents.acp.contract import rich_status
from cleveragents.acp.contract.errors import ACPError
from tests.conformance.harness import error_json


def test_an_error_read_off_grpc_keeps_its_status() -> None:
    error = rich_status.from_status(grpc.StatusCode.NOT_FOUND, "no such plan", None)
    assert error.grpc_status == "NOT_FOUND"
    assert error_json(error)["grpc_status"] == "NOT_FOUND"


def test_a_status_other_than_the_tables_makes_the_trace_differ() -> None:
    local = error_json(ACPError("NOT_FOUND", "no such plan"))
    assert local["grpc_status"] == "NOT_FOUND"
    wrong = rich_status.from_status(grpc.StatusCode.INTERNAL, "no such plan", None)
    wrong.code = "NOT_FOUND"  # the ACP code survived, the status did not
    assert error_json(wrong) != local
