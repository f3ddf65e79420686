"""Two replicas (two facades, each with its own PostgresStore) on one PostgreSQL schema:
``session.tell`` on one session through both at once loses no message and keeps the
indexes 0..n-1, every reply after the message it answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import session_pb2

TELLS_EACH = 12


@pytest.fixture
async def replicas(pg_url: str) -> AsyncIterator[tuple[ACPClient, ACPClient]]:
    first = ACPClient(LocalTransport(open_facade(pg_url), owns_facade=True))
    second = ACPClient(LocalTransport(open_facade(pg_url), owns_facade=True))
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


async def test_tells_through_two_replicas_at_once_keep_one_ordered_history(
    replicas: tuple[ACPClient, ACPClient],
) -> None:
    first, second = replicas
    created = await first.call("session.create", title="shared")
    assert isinstance(created, session_pb2.CreateSessionResponse)
    session_id = created.session.meta.id

    async def tell(client: ACPClient, text: str) -> session_pb2.TellSessionResponse:
        told = await client.call("session.tell", session_id=session_id, content=text)
        assert isinstance(told, session_pb2.TellSessionResponse)
        return told

    texts = [f"{name}-{i}" for i in range(TELLS_EACH) for name in ("a", "b")]
    answers = await asyncio.gather(*(tell(first if text.startswith("a") else second, text) for text in texts))
    shown = await second.call("session.show", session_id=session_id)
    assert isinstance(shown, session_pb2.GetSessionResponse)
    history = list(shown.messages)
    assert [m.index for m in history] == list(range(len(history)))
    told = [m.content for m in history if m.role == session_pb2.MESSAGE_ROLE_USER]
    assert sorted(told) == sorted(texts)
    by_id = {m.id: m.index for m in history}
    for answer in answers:
        assert by_id[answer.message.id] == answer.message.index
        for reply in answer.replies:
            assert by_id[reply.id] == reply.index > answer.message.index
    # Both replicas read the same history.
    again = await first.call("session.show", session_id=session_id)
    assert isinstance(again, session_pb2.GetSessionResponse)
    assert list(again.messages) == history
