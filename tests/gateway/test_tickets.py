"""Stream tickets over HTTP on real servers: ``?ticket=`` instead of Authorization on the
SSE route, the refusals as envelopes before any stream header, a gateway passing the
ticket to its upstream over gRPC, and no ticket in the server's logs."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.gateway.conftest import Served
from tests.gateway.test_http import data_of, envelope, error_of
from tests.gateway.test_sse import STREAM, Frames, new_session, tell
from tests.server_process import Children, Tokens, start_gateway, start_server


@pytest.fixture
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.server.http, timeout=10) as client:
        yield client


def ticket_for(client: httpx.Client, token: str, **filters: Any) -> str:
    answer = data_of(envelope(client, {"operation": "events.ticket", "params": filters}, token))
    assert answer["expire_time"].endswith("Z")
    ticket: str = answer["ticket"]
    return ticket


def open_with_ticket(client: httpx.Client, ticket: str, **params: Any) -> Any:
    return client.stream("GET", STREAM, params={"ticket": ticket, **params})


def test_a_ticket_opens_the_stream_once_and_resumes_with_a_new_one(
    http: httpx.Client, served: Served
) -> None:
    token = served.token()
    session_id = new_session(http, token)
    tell(http, token, session_id, "one")
    ticket = ticket_for(http, token, session_id=session_id, event_type=["session.message"])
    query = {"session_id": session_id, "event_type": "session.message"}
    with open_with_ticket(http, ticket, **query) as response:
        assert response.status_code == 200
        frames = Frames(response)
        first = frames.next()
        assert first.event == "session.message"
    with open_with_ticket(http, ticket, **query) as reused:
        assert reused.status_code == 401
        reused.read()
        assert error_of(reused, "AUTH_REQUIRED")["refinement"] == "TICKET_USED"
        assert reused.headers["content-type"] == "application/json"
    # What a page does when its connection drops: a fresh ticket, and after_sequence.
    tell(http, token, session_id, "two")
    fresh = ticket_for(http, token, session_id=session_id, event_type=["session.message"])
    with open_with_ticket(http, fresh, after_sequence=first.id, **query) as response:
        resumed = Frames(response).next()
        assert int(resumed.id or 0) > int(first.id or 0)


@pytest.mark.parametrize(
    ("params", "headers", "status", "field_or_refinement"),
    [
        ({"plan_id": "other"}, {}, 401, "TICKET_FILTERS_DIFFER"),
        ({}, {"Authorization": "Bearer x"}, 401, "AMBIGUOUS_CREDENTIALS"),
        ({"ticket": "acpt_second"}, {}, 401, "AMBIGUOUS_CREDENTIALS"),
    ],
)
def test_refusals_are_envelopes_before_any_stream_header(
    http: httpx.Client,
    served: Served,
    params: dict[str, str],
    headers: dict[str, str],
    status: int,
    field_or_refinement: str,
) -> None:
    ticket = ticket_for(http, served.token())
    query: list[tuple[str, str | int | float | bool | None]] = [("ticket", ticket), *params.items()]
    response = http.get(STREAM, params=query, headers=headers)
    assert response.status_code == status
    details = response.json()["error"]["details"]
    assert field_or_refinement in (details.get("refinement"), details.get("field"))
    assert ticket not in response.text


def test_a_ticket_is_accepted_on_the_stream_only(http: httpx.Client, served: Served) -> None:
    ticket = ticket_for(http, served.token())
    response = http.get("/api/v1/sessions", params={"ticket": ticket})
    assert error_of(response, "INVALID_PARAMS")["field"] == "ticket"
    refused = http.get(STREAM, params={"ticket": "acpt_made-up"})
    assert error_of(refused, "AUTH_REQUIRED")["refinement"] == "TICKET_UNKNOWN"


def test_a_client_of_1_1_gets_no_ticket(http: httpx.Client, served: Served) -> None:
    response = envelope(http, {"operation": "events.ticket", "acp_version": "1.1"}, served.token())
    assert error_of(response, "VERSION_MISMATCH")["operation"] == "events.ticket"


def test_the_openapi_document_names_the_ticket(http: httpx.Client) -> None:
    document = http.get("/api/v1/openapi.json").json()
    stream = document["paths"][STREAM]["get"]
    assert {"bearer": []} in stream["security"]
    assert {"streamTicket": []} in stream["security"]
    assert any(p["name"] == "ticket" and p["in"] == "query" for p in stream["parameters"])
    assert document["paths"]["/api/v1/events/ticket"]["post"]["operationId"] == "events.ticket"


def test_a_gateway_passes_the_ticket_upstream_and_nothing_logs_it(
    tmp_path: pathlib.Path, children: Children
) -> None:
    tokens = Tokens.create(tmp_path)
    server = children.server(start_server(tmp_path, "--log-level", "debug", tokens=tokens.path))
    gateway = children.server(start_gateway(tmp_path, server.grpc_target, "--log-level", "debug"))
    tickets: list[str] = []
    try:
        with httpx.Client(base_url=gateway.http, timeout=10) as client:
            token = tokens.tokens["alice"]
            session_id = new_session(client, token)
            tell(client, token, session_id, "hello")
            ticket = ticket_for(client, token, session_id=session_id)
            tickets.append(ticket)
            with open_with_ticket(client, ticket, session_id=session_id) as response:
                assert response.status_code == 200
                assert (
                    Frames(response).next().event == "session.turn_started"
                )  # the tell's first event (ACP 1.3)
            with open_with_ticket(client, ticket, session_id=session_id) as reused:
                reused.read()
                assert error_of(reused, "AUTH_REQUIRED")["refinement"] == "TICKET_USED"
            tickets.append(ticket_for(client, token, session_id=session_id))
            refused = client.get(STREAM, params={"ticket": tickets[-1], "plan_id": "p"})
            assert refused.status_code == 401
    finally:
        assert gateway.stop() == 0
        assert server.stop() == 0
    logs = server.stderr() + gateway.stderr() + "\n".join(server.stdout + gateway.stdout)
    assert logs.strip(), "the debug logs are empty: the check below would prove nothing"
    for ticket in tickets:
        assert ticket not in logs
        assert ticket[5:] not in logs
