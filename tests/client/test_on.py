"""``client.on(filters, callback)``: events handed to a callback from a task of its own; a
refusal ends it with the error; a server killed and restarted is resumed without a gap."""

from __future__ import annotations

import asyncio
import pathlib
import signal

import httpx

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import events_pb2
from tests.fake_openai import eventually
from tests.server_process import Children, Tokens, start_server

TELL = 4  # turn_started, the two messages, turn_completed
WAIT = 30.0


async def test_callbacks_sync_and_async_with_filters(client: ACPClient) -> None:
    first = (await client.call("session.create", title="one")).session.meta.id  # type: ignore[attr-defined]
    second = (await client.call("session.create", title="two")).session.meta.id  # type: ignore[attr-defined]
    seen: list[events_pb2.Event] = []
    states: list[bool] = []

    async def later(event: events_pb2.Event) -> None:
        await asyncio.sleep(0)
        seen.append(event)

    handle = client.on({"session_id": first}, later, on_state=lambda up, _: states.append(up))
    plain: list[str] = []
    types = client.on(
        {"event_type": ["session.message"]}, lambda e: plain.append(e.session_message.message.content)
    )
    try:
        await eventually(lambda: handle.connected and types.connected, WAIT)
        await client.call("session.tell", session_id=second, content="elsewhere")
        await client.call("session.tell", session_id=first, content="/help")
        await eventually(lambda: len(seen) == TELL and len(plain) == 4, WAIT)
    finally:
        await handle.stop()
        await types.stop()
    assert {e.session_id for e in seen if e.session_id} == {first}
    assert [e.sequence for e in seen] == sorted(e.sequence for e in seen)
    assert handle.last_sequence == seen[-1].sequence
    assert plain[0::2] == ["elsewhere", "/help"]
    assert states == [True]
    assert handle.done
    assert handle.error is None


async def test_a_refused_subscription_ends_with_its_error(client: ACPClient) -> None:
    told: list[tuple[bool, ACPError | None]] = []
    handle = client.on({"event_type": ["no.such_type"]}, lambda e: None, on_state=lambda *s: told.append(s))
    await eventually(lambda: handle.done, WAIT)
    assert handle.error is not None
    assert handle.error.code == "INVALID_PARAMS"
    assert told == [(False, handle.error)]
    await handle.stop()


def test_resumes_after_the_server_is_killed_and_restarted(tmp_path: pathlib.Path, children: Children) -> None:
    tokens = Tokens.create(tmp_path)
    server = children.server(start_server(tmp_path, tokens=tokens.path, name="acp"))
    port = server.http.rsplit(":", 1)[1]

    async def run() -> None:
        nonlocal server
        http = httpx.AsyncClient(base_url=server.http, timeout=httpx.Timeout(None, connect=5.0))
        client = ACPClient(HTTPTransport(http, owns_client=True), token=tokens.tokens["root"])
        seen: list[events_pb2.Event] = []
        states: list[bool] = []
        handle = client.on({}, seen.append, on_state=lambda up, _: states.append(up))
        try:
            session_id = (await client.call("session.create")).session.meta.id  # type: ignore[attr-defined]
            await client.call("session.tell", session_id=session_id, content="one")
            await eventually(lambda: len(seen) >= TELL, WAIT)
            assert server.stop(signal.SIGKILL) == -signal.SIGKILL
            await eventually(lambda: states[-1] is False, WAIT)
            # While the server is down its database moves on: the listener gets this too.
            local = ACPClient(LocalTransport(open_facade(tmp_path / "acp.db"), owns_facade=True))
            async with local:
                await local.call("session.tell", session_id=session_id, content="two")
            server = children.server(
                start_server(tmp_path, "--http-port", port, tokens=tokens.path, name="acp")
            )
            await client.call("session.tell", session_id=session_id, content="three")
            await eventually(lambda: len(seen) >= 3 * TELL, WAIT)
        finally:
            await handle.stop()
            await client.close()
        assert [e.sequence for e in seen] == list(range(1, 3 * TELL + 1))
        said = [e.session_message.message.content for e in seen[1::TELL]]
        assert said == ["one", "two", "three"]
        assert states[0] is True
        assert states[-1] is True
        assert False in states
        assert handle.reconnects >= 1

    try:
        asyncio.run(run())
    finally:
        server.stop()
