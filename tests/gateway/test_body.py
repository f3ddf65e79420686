"""Reading a request body and headers straight from the ASGI messages and scope."""

from __future__ import annotations

import pytest
from starlette.requests import Request
from starlette.types import Message

from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.gateway.http import binding


def request(messages: list[Message], headers: list[tuple[bytes, bytes]] | None = None) -> Request:
    pending = list(messages)

    async def receive() -> Message:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    return Request({"type": "http", "method": "POST", "headers": headers or []}, receive)


async def test_a_body_in_several_messages_is_joined() -> None:
    parts: list[Message] = [
        {"type": "http.request", "body": b"ab", "more_body": True},
        {"type": "http.request", "body": b"cd"},
    ]
    assert await binding.read_body(request(parts), 10) == b"abcd"
    assert await binding.read_body(request([{"type": "http.request"}]), 10) == b""


async def test_a_body_over_the_limit_is_refused_as_it_comes_or_as_declared() -> None:
    parts: list[Message] = [
        {"type": "http.request", "body": b"abcdef", "more_body": True},
        {"type": "http.request", "body": b"gh"},
    ]
    with pytest.raises(ACPError) as info:
        await binding.read_body(request(parts), 7)
    assert (info.value.code, info.value.details["field"]) == ("INVALID_PARAMS", "body")
    declared = request([{"type": "http.request", "body": b""}], [(b"content-length", b"999")])
    with pytest.raises(ACPError, match="999 bytes"):
        await binding.read_body(declared, 7)


async def test_a_client_gone_before_its_body_is_a_peer_gone_error() -> None:
    with pytest.raises(binding.PeerGoneError):
        await binding.read_body(request([{"type": "http.request", "body": b"a", "more_body": True}]), 10)


def test_headers_are_found_by_lower_case_name_first_one_wins() -> None:
    found = request([], [(b"x-a", b"1"), (b"authorization", b"Bearer t\xe9"), (b"x-a", b"2")])
    assert binding.header(found, b"x-a") == "1"
    assert binding.header(found, b"authorization") == "Bearer t\xe9"
    assert binding.header(found, b"x-missing") is None
    assert binding.header(found, b"x-a") == found.headers.get("x-a")
