"""Issue 17, findings 7 and 8 (JSON half): duplicate JSON keys and a non-ASCII
``Last-Event-ID`` are INVALID_PARAMS envelopes on every JSON entry, never a silent choice or
a 500."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.gateway.test_http import error_of
from tests.security.bounded_server import Bounded, bounded  # noqa: F401 - the fixture

STREAM = "/api/v1/events/stream"
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def http(bounded: Bounded) -> Iterator[httpx.Client]:  # noqa: F811 - the imported fixture
    with bounded.client() as client:
        yield client


def test_duplicate_keys_in_an_envelope_are_refused(http: httpx.Client) -> None:
    for body in (
        b'{"operation": "session.create", "operation": "session.list", "params": {}}',
        b'{"operation": "session.create", "params": {"title": "a", "title": "b"}}',
        b'{"operation": "session.create", "params": {"title": "t:1", "labels": {"k": "a", "k": "b"}}}',
        b'{"operation": "session.create", "params": {"title": "x", "\\u0074itle": "y"}}',
    ):
        details = error_of(http.post("/api/v1/acp", content=body, headers=JSON), "INVALID_PARAMS")
        assert details["field"] == "body"
        assert details["duplicate_key"] in {"operation", "title", "k"}


def test_duplicate_keys_in_a_rest_body_are_refused(http: httpx.Client) -> None:
    body = b'{"title": "a", "labels": {"team": "a", "team": "b"}}'
    details = error_of(http.post("/api/v1/sessions", content=body, headers=JSON), "INVALID_PARAMS")
    assert details == {"field": "body", "duplicate_key": "team"}
    # Colons inside strings are not keys: the same body without the repeat is fine.
    ok = http.post("/api/v1/sessions", content=b'{"title": "a:b", "labels": {"t": "1:2"}}', headers=JSON)
    assert ok.status_code == 200, ok.text


def test_a_non_ascii_digit_in_last_event_id_is_invalid_params(http: httpx.Client) -> None:
    for value in (b"\xb2", b"1\xb2", b"\xd9\xa3"):  # "²", "1²", and Arabic-Indic "٣" as latin-1
        response = http.get(STREAM, headers={b"Last-Event-ID": value})
        assert error_of(response, "INVALID_PARAMS")["field"] == "Last-Event-ID"
