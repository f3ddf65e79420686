"""A large ``session.import`` leaves the loop to others while its body is decoded (issue
31, failure 7: others' worst latency went from 23-82 ms to 1.5-5.3 s during one).

In process, over ASGI with a real facade: a ticker task counts the loop's turns, and the
test reads the count before and after the import's JSON-to-protobuf conversion
(``codec.from_dict``; 20,000 messages). Run on the loop, as before, it cannot see a single
turn of the ticker; run on a worker thread, the ticker goes on meanwhile. The JSON parse
(mostly orjson, in C) is checked to run off the loop's thread. The observables are the
count and the thread, not a duration."""

from __future__ import annotations

import asyncio
import pathlib
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from cleveragents.acp.contract import codec, strict_json
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.gateway.http.fastapi_app import GatewaySettings, build_app

MESSAGES = 20_000
# A small body limit: the document is over it, as a large import is over the default one.
BODY_LIMIT = 64 * 1024


@pytest.fixture
async def http(tmp_path: pathlib.Path) -> AsyncIterator[httpx.AsyncClient]:
    facade = open_facade(tmp_path / "acp.db")
    app = build_app(facade, GatewaySettings(max_body_bytes=BODY_LIMIT))
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://acp") as client:
            yield client
    finally:
        await facade.close()


async def call(http: httpx.AsyncClient, operation: str, params: dict[str, Any]) -> dict[str, Any]:
    answer = await http.post(
        "/api/v1/acp", json={"acp_version": "1.1", "operation": operation, "params": params}
    )
    body: dict[str, Any] = answer.json()
    assert body["status"] == "ok", body
    return dict(body["data"])


@dataclass
class Seen:
    """A large call of a wrapped function: the ticker's turns meanwhile, and its thread."""

    ticks: int
    on_loop: bool


def counted(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, ticks: list[int], seen: list[Seen]
) -> None:
    """Wrap ``owner.name`` to record what happened while each large call of it ran."""
    original: Callable[..., Any] = getattr(owner, name)
    loop_thread = threading.get_ident()

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        before = ticks[0]
        result = original(*args, **kwargs)
        if _is_large(args[0]):
            seen.append(Seen(ticks[0] - before, threading.get_ident() == loop_thread))
        return result

    monkeypatch.setattr(owner, name, wrapper)


def _is_large(value: Any) -> bool:
    return (isinstance(value, bytes) and len(value) > BODY_LIMIT) or (
        isinstance(value, dict) and "document" in value
    )


async def test_a_large_import_is_decoded_while_the_loop_serves_others(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    session_id = (await call(http, "session.create", {"title": "big"}))["session"]["meta"]["id"]
    exported = await call(http, "session.export", {"session_id": session_id})
    await call(http, "session.delete", {"session_id": session_id})
    document = exported["document"]
    stamp = document["session"]["meta"]["create_time"]
    document["messages"] = [
        {
            "id": f"m{index}",
            "index": index,
            "role": "MESSAGE_ROLE_USER",
            "content": "x" * 40,
            "create_time": stamp,
        }
        for index in range(MESSAGES)
    ]
    document["session"]["message_count"] = MESSAGES
    ticks = [0]
    parsed: list[Seen] = []
    converted: list[Seen] = []
    counted(monkeypatch, strict_json, "loads", ticks, parsed)
    counted(monkeypatch, codec, "from_dict", ticks, converted)
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            ticks[0] += 1
            await asyncio.sleep(0)

    running = asyncio.create_task(ticker())
    try:
        answer = await call(http, "session.import", {"document": document})
    finally:
        stop.set()
        await running
    assert answer["session"]["message_count"] == MESSAGES
    assert [seen.on_loop for seen in parsed] == [False], "the JSON parse ran on the loop"
    assert [seen.on_loop for seen in converted] == [False], "the conversion to protobuf ran on the loop"
    assert converted[0].ticks > 0, "the conversion to protobuf held the loop"
