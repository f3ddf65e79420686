"""The JSON/HTTP gateway of a real server: envelope, REST routes, errors, auth, versions."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import orjson
import pytest

from cleveragents.acp.contract import catalog, versions
from cleveragents.acp.contract.errors import http_status
from cleveragents.acp.contract.required import required_fields
from tests.gateway.conftest import MAX_BODY, Served

ULID = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")
UNARY_PRIVATE = [op for op in catalog.OPERATIONS.values() if not op.anonymous and not op.server_streaming]


@pytest.fixture
def http(served: Served) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=served.server.http, timeout=10) as client:
        yield client


def envelope(client: httpx.Client, body: Any, token: str | None = None, **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else orjson.dumps(body)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return client.post("/api/v1/acp", content=content, headers=headers)


def error_of(response: httpx.Response, code: str) -> dict[str, Any]:
    """The envelope's error, after checking the envelope shape and the ADR status."""
    assert response.headers["content-type"] == "application/json", response.text
    body = response.json()
    assert body["status"] == "error", body
    assert body["data"] is None
    assert body["error"]["code"] == code, body
    assert response.status_code == http_status(code), (response.status_code, body)
    assert body["request_id"] == response.headers["x-request-id"]
    assert body["timing"]["duration_ms"] >= 0
    details: dict[str, Any] = body["error"]["details"]
    return details


def data_of(response: httpx.Response) -> dict[str, Any]:
    body = response.json()
    assert response.status_code == 200, body
    assert body["status"] == "ok", body
    assert body["error"] is None
    data: dict[str, Any] = body["data"]
    return data


# -- the envelope ------------------------------------------------------------------------------


def test_version_is_open_on_the_envelope_and_rest(http: httpx.Client) -> None:
    by_envelope = data_of(envelope(http, {"operation": "meta.version"}))
    response = http.get("/api/v1/version")
    assert data_of(response) == by_envelope
    assert by_envelope["supported_versions"] == list(versions.SUPPORTED) == ["1.3", "1.2", "1.1"]
    assert by_envelope["server_build"].startswith("cleveragents-acp")
    assert response.headers["acp-version"] == versions.CURRENT


def test_request_id_is_echoed_or_generated(http: httpx.Client) -> None:
    body = envelope(http, {"operation": "meta.version", "request_id": "req-42"}).json()
    assert body["request_id"] == "req-42"
    assert body["timing"]["duration_ms"] >= 0
    generated = envelope(http, {"operation": "meta.version"}).json()["request_id"]
    assert ULID.match(generated)
    by_header = http.get("/api/v1/version", headers={"X-Request-ID": "hdr-1"})
    assert by_header.json()["request_id"] == "hdr-1" == by_header.headers["x-request-id"]
    details = error_of(
        envelope(http, {"operation": "meta.version", "request_id": "has space"}), "INVALID_PARAMS"
    )
    assert details["field"] == "request_id"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"{bad", "body"),
        (b"", "body"),
        (b"   ", "body"),
        (b"\xff\xfe{}", "body"),
        (b"[1, 2]", "envelope"),
        (b'"meta.version"', "envelope"),
        (b"42", "envelope"),
        (b"null", "envelope"),
        (b'{"operation": 5}', "operation"),
        (b'{"operation": "meta.version", "params": []}', "params"),
        (b'{"operation": "meta.version", "params": {"bogus": 1}}', "params"),
        (b'{"operation": "meta.version", "auth": "token"}', "auth"),
        (b'{"operation": "meta.version", "acp_version": 1.1}', "acp_version"),
        (b'{"params": {}}', "operation"),
        (b'{"operation": "meta.version", "extra": true}', "envelope"),
        (b"[" * 5000 + b"]" * 5000, "body"),
    ],
)
def test_bad_envelopes_answer_invalid_params(http: httpx.Client, body: bytes, field: str) -> None:
    assert error_of(envelope(http, body), "INVALID_PARAMS")["field"] == field


def test_deeply_nested_params_are_refused(http: httpx.Client, served: Served) -> None:
    nested: dict[str, Any] = {}
    for _ in range(100):
        nested = {"a": nested}
    body = {"operation": "session.create", "params": {"labels": nested}}
    assert error_of(envelope(http, body, served.token()), "INVALID_PARAMS")["field"] == "params"


def test_wrong_field_types(http: httpx.Client, served: Served) -> None:
    body = {"operation": "session.list", "params": {"page_size": "many"}}
    assert error_of(envelope(http, body, served.token()), "INVALID_PARAMS")["field"] == "params"
    body = {"operation": "session.list", "params": {"namespace": ["default"]}}
    error_of(envelope(http, body, served.token()), "INVALID_PARAMS")


def test_unknown_operation_is_not_found(http: httpx.Client) -> None:
    details = error_of(envelope(http, {"operation": "plan.fly"}), "NOT_FOUND")
    assert details == {"operation": "plan.fly"}


def test_a_stream_is_not_an_envelope_call(http: httpx.Client, served: Served) -> None:
    error_of(envelope(http, {"operation": "events.subscribe"}, served.token()), "INVALID_PARAMS")


@pytest.mark.parametrize(
    "op", [op for op in UNARY_PRIVATE if required_fields(op.request_type.DESCRIPTOR)][:5]
)
def test_missing_required_fields(http: httpx.Client, served: Served, op: catalog.Operation) -> None:
    details = error_of(envelope(http, {"operation": op.name}, served.token("root")), "INVALID_PARAMS")
    assert details["missing_fields"], details


def test_body_over_the_limit(http: httpx.Client, served: Served) -> None:
    big = orjson.dumps({"operation": "meta.version", "params": {}, "request_id": "x" * MAX_BODY})
    # Past the limit a body is read only for a caller verified by header (docs/security.md,
    # "A large request authenticates by header"): an anonymous one is refused unread.
    unverified = error_of(envelope(http, big), "AUTH_REQUIRED")
    assert unverified["refinement"] == "HEADER_AUTH_REQUIRED", unverified
    details = error_of(envelope(http, big, served.token()), "INVALID_PARAMS")
    assert details == {"field": "body", "max_bytes": MAX_BODY}

    def chunks() -> Iterator[bytes]:
        yield b'{"operation": "meta.version", "request_id": "'
        for _ in range(MAX_BODY // 1024 + 1):
            yield b"y" * 1024
        yield b'"}'

    bearer = {"Authorization": f"Bearer {served.token()}"}
    chunked = http.post("/api/v1/acp", content=chunks(), headers=bearer)
    assert error_of(chunked, "INVALID_PARAMS")["max_bytes"] == MAX_BODY


def test_unknown_paths_and_methods_answer_envelopes(http: httpx.Client) -> None:
    assert error_of(http.get("/nowhere"), "NOT_FOUND")["path"] == "/nowhere"
    assert error_of(http.get("/api/v1/plans/x/y/z"), "NOT_FOUND")
    wrong = http.put("/api/v1/version")
    assert error_of(wrong, "NOT_FOUND")["allowed_methods"] == ["GET"]
    assert wrong.headers["allow"] == "GET"
    assert error_of(http.get("/api/v1/acp"), "NOT_FOUND")["allowed_methods"] == ["POST"]
    assert error_of(http.request("BREW", "/api/v1/acp"), "NOT_FOUND")
    # No method tunnelling: the override header changes nothing.
    tunnelled = http.post("/api/v1/version", headers={"X-HTTP-Method-Override": "GET"})
    assert error_of(tunnelled, "NOT_FOUND")["allowed_methods"] == ["GET"]


def test_health_and_openapi(http: httpx.Client) -> None:
    assert data_of(http.get("/healthz")) == {"status": "SERVING"}
    assert http.head("/healthz").status_code == 200
    document = http.get("/api/v1/openapi.json").json()
    assert document["openapi"].startswith("3.")
    for op in catalog.OPERATIONS.values():
        spec = document["paths"][op.http.path][op.http.method.lower()]
        assert spec["operationId"] == op.name
    schemas = document["components"]["schemas"]
    tell = schemas["cleveragents.acp.v1.TellSessionRequest"]
    assert tell["required"] == ["session_id", "content"]
    assert tell["additionalProperties"] is False
    assert "/api/v1/acp" in document["paths"]


# -- auth --------------------------------------------------------------------------------------


# Every operation without a token, with an unknown one, another namespace's and a good one,
# on the envelope, the REST routes and gRPC: tests/conformance/generated.py (auth.matrix).


def test_a_malformed_authorization_header_is_no_token(http: httpx.Client, served: Served) -> None:
    for value in (f"Basic {served.token()}", "Bearer", served.token()):
        response = http.get("/api/v1/sessions", headers={"Authorization": value})
        error_of(response, "AUTH_REQUIRED")


def test_token_in_the_envelope(http: httpx.Client, served: Served) -> None:
    body = {"operation": "session.list", "auth": {"token": served.token()}}
    assert "sessions" in data_of(envelope(http, body))
    for header in (served.token("bob"), served.token()):
        both = envelope(http, body, header)
        assert error_of(both, "AUTH_REQUIRED")["refinement"] == "AMBIGUOUS_CREDENTIALS"
        assert both.headers["www-authenticate"] == 'Bearer realm="acp", error="invalid_request"'


def test_namespaces_are_enforced(http: httpx.Client, served: Served) -> None:
    created = data_of(envelope(http, {"operation": "session.create"}, served.token("alice")))
    session_id = created["session"]["meta"]["id"]
    forbidden = envelope(
        http, {"operation": "session.create", "params": {"namespace": "default"}}, served.token("bob")
    )
    assert error_of(forbidden, "AUTH_FORBIDDEN")["namespace"] == "default"
    show = {"operation": "session.show", "params": {"session_id": session_id}}
    # Another namespace's session by id answers as an unknown id (issue 31, finding 9).
    assert error_of(envelope(http, show, served.token("bob")), "NOT_FOUND") == {
        "session_id": session_id,
        "refinement": "SESSION_NOT_FOUND",
    }
    assert data_of(envelope(http, show, served.token("root")))["session"]["meta"]["id"] == session_id
    listing = {"operation": "session.list", "params": {"page_size": 500}}
    bob_ids = [s["meta"]["id"] for s in data_of(envelope(http, listing, served.token("bob")))["sessions"]]
    root_ids = [s["meta"]["id"] for s in data_of(envelope(http, listing, served.token("root")))["sessions"]]
    assert session_id not in bob_ids
    assert session_id in root_ids
    rest = http.get(
        f"/api/v1/sessions/{session_id}", headers={"Authorization": f"Bearer {served.token('bob')}"}
    )
    assert rest.status_code == 404
    error_of(rest, "NOT_FOUND")


# -- versions ----------------------------------------------------------------------------------


def test_versions(http: httpx.Client, served: Served) -> None:
    for version in versions.SUPPORTED:
        response = envelope(http, {"operation": "session.list", "acp_version": version}, served.token())
        assert response.json()["acp_version"] == version
        data_of(response)
        by_header = http.get(
            "/api/v1/sessions", headers={"ACP-Version": version, "Authorization": f"Bearer {served.token()}"}
        )
        assert by_header.json()["acp_version"] == version == by_header.headers["acp-version"]
    # Every operation at every version: tests/conformance/generated.py (version.matrix).
    prior = versions.SUPPORTED[-1]
    for newer in (op for op in UNARY_PRIVATE if versions.newer(op.since, prior)):
        details = error_of(
            envelope(http, {"operation": newer.name, "acp_version": prior}, served.token()),
            "VERSION_MISMATCH",
        )
        assert details["since"] == newer.since
    old_client = envelope(http, {"operation": "meta.version", "acp_version": "1.0"})
    assert error_of(old_client, "VERSION_MISMATCH")["supported_versions"] == list(versions.SUPPORTED)
    for version in ("2.0", "0.9", "1", "latest"):
        response = envelope(http, {"operation": "meta.version", "acp_version": version})
        assert error_of(response, "VERSION_MISMATCH")["requested"] == version
        assert response.json()["acp_version"] == versions.CURRENT
        rest = http.get("/api/v1/version", headers={"ACP-Version": version})
        assert error_of(rest, "VERSION_MISMATCH")["supported_versions"] == list(versions.SUPPORTED)


# -- REST routes -------------------------------------------------------------------------------


def test_rest_routes_bind_path_query_and_body(http: httpx.Client, served: Served) -> None:
    auth = {"Authorization": f"Bearer {served.token()}"}
    created = data_of(http.post("/api/v1/sessions", json={"title": "rest"}, headers=auth))
    session_id = created["session"]["meta"]["id"]
    shown = data_of(http.get(f"/api/v1/sessions/{session_id}", headers=auth))
    assert shown["session"]["meta"]["id"] == session_id
    exported = data_of(http.get(f"/api/v1/sessions/{session_id}:export", headers=auth))
    assert exported
    told = data_of(http.post(f"/api/v1/sessions/{session_id}:tell", json={"content": "hi"}, headers=auth))
    assert told["message"]["content"] == "hi"
    listed = data_of(http.get("/api/v1/sessions", params={"page_size": "1"}, headers=auth))
    assert len(listed["sessions"]) == 1
    error_of(http.get("/api/v1/sessions/x:bogus", headers=auth), "NOT_FOUND")


def test_rest_binding_errors(http: httpx.Client, served: Served) -> None:
    auth = {"Authorization": f"Bearer {served.token()}"}
    cases = [
        http.get("/api/v1/sessions", params={"bogus": "1"}, headers=auth),
        http.get("/api/v1/sessions", params={"page_size": "many"}, headers=auth),
        http.get("/api/v1/sessions?page_size=1&page_size=2", headers=auth),
        http.request("GET", "/api/v1/sessions", content=b'{"page_size": 1}', headers=auth),
        http.post("/api/v1/sessions?title=x", json={}, headers=auth),
        http.post("/api/v1/sessions", content=b"[]", headers=auth),
        http.post("/api/v1/sessions", content=b"{nope", headers=auth),
        http.post("/api/v1/sessions", json={"bogus": 1}, headers=auth),
        http.post("/api/v1/sessions/abc:tell", json={"session_id": "def", "content": "x"}, headers=auth),
        http.get("/api/v1/sessions/abc", params={"session_id": "def"}, headers=auth),
    ]
    for response in cases:
        error_of(response, "INVALID_PARAMS")


def test_cors_is_off_by_default(http: httpx.Client) -> None:
    response = http.options(
        "/api/v1/acp",
        headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in response.headers
    assert error_of(response, "NOT_FOUND")


def test_rest_lists_filter_by_map_entries(http: httpx.Client, served: Served) -> None:
    """Found by the contract suite: list routes could not take the label filter the envelope
    and gRPC take. Map entries go as `labels[key]=v` (OpenAPI deepObject) or `labels.key=v`."""
    auth = {"Authorization": f"Bearer {served.token()}"}
    for name, team in (("lab-a", "a"), ("lab-b", "b")):
        body = {"name": name, "labels": {"team": team, "app.io/part": "x"}, "spec": {"instructions": "hi"}}
        data_of(http.post("/api/v1/skills", json=body, headers=auth))
    queries = [{"labels[team]": "a"}, {"labels.team": "a"}, {"labels.app.io/part": "x", "labels.team": "a"}]
    for query in queries:
        listed = data_of(http.get("/api/v1/skills", params=query, headers=auth))
        assert [s["name"] for s in listed["skills"]] == ["lab-a"], query
    for bad in ("labels", "labels[team][x]", "namespace[x]", "labels.team"):
        response = http.get(f"/api/v1/skills?{bad}=a&{bad}=b", headers=auth)
        error_of(response, "INVALID_PARAMS")
    document = http.get("/api/v1/openapi.json").json()
    parameters = document["paths"]["/api/v1/skills"]["get"]["parameters"]
    labels = next(p for p in parameters if p["name"] == "labels")
    assert (labels["style"], labels["explode"]) == ("deepObject", True)


def test_answers_validate_against_the_openapi_envelope_schema(http: httpx.Client) -> None:
    """Found by schemathesis: the document described `error` (and every message field) as an
    object, so each ok envelope's `error: null` broke its own schema."""
    document = http.get("/api/v1/openapi.json").json()
    validator = jsonschema.Draft202012Validator(
        {"$ref": "#/components/schemas/cleveragents.acp.v1.ResponseEnvelope", **document}
    )
    for response in (http.get("/api/v1/version"), http.get("/api/v1/sessions")):
        validator.validate(response.json())
