"""Writes until killed, printing one ack line after each write returns (see test_crash).

``store`` mode writes records, items and events through the store and the event log;
``facade`` mode makes ACP calls (session.create, session.tell) through the facade;
``concurrent`` mode makes them from many tasks at once, so commits are grouped; ``traced``
mode (see test_durability) prints ``start`` and ``ack`` around each call and then exits."""

from __future__ import annotations

import asyncio
import sys
import time

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.facade.domain.events.log import EventLog
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.store.base import Record
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import events_pb2, session_pb2


def ack(*words: object) -> None:
    print(*words, flush=True)


def write_store(path: str, limit: int) -> None:
    store = SQLiteStore(path)
    log = EventLog(store)
    ack("ready")
    for i in range(limit):
        now = time.time()
        record_id = f"rec-{i:06d}"
        store.insert(Record(kind="session", id=record_id, namespace="default", body=b"x", create_time=now))
        ack("record", record_id)
        store.append_items("messages", record_id, [f"message {i}".encode()])
        ack("item", record_id)
        published = log.publish(
            events_pb2.Event(
                namespace="default",
                session_id=record_id,
                log_record=events_pb2.LogRecord(message=f"write {i}"),
            )
        )
        ack("event", published.sequence, record_id)


async def call_facade(path: str, limit: int) -> None:
    client = ACPClient(LocalTransport(open_facade(path), owns_facade=True))
    ack("ready")
    for i in range(limit):
        created = await client.call("session.create", title=f"crash {i}")
        assert isinstance(created, session_pb2.CreateSessionResponse)
        session_id = created.session.meta.id
        ack("session", session_id)
        told = await client.call("session.tell", session_id=session_id, content=f"hello-{i}")
        assert isinstance(told, session_pb2.TellSessionResponse)
        ack("tell", session_id, f"hello-{i}")


async def call_concurrently(path: str, limit: int, writers: int = 16) -> None:
    client = ACPClient(LocalTransport(open_facade(path), owns_facade=True))
    ack("ready")

    async def writer(w: int) -> None:
        for i in range(limit):
            created = await client.call("session.create", title=f"crash {w}-{i}")
            assert isinstance(created, session_pb2.CreateSessionResponse)
            session_id = created.session.meta.id
            ack("session", session_id)
            content = f"hello-{w}-{i}"
            told = await client.call("session.tell", session_id=session_id, content=content)
            assert isinstance(told, session_pb2.TellSessionResponse)
            ack("tell", session_id, content)

    await asyncio.gather(*(writer(w) for w in range(writers)))


async def call_traced(path: str, limit: int, writers: int = 4) -> None:
    async with ACPClient(LocalTransport(open_facade(path), owns_facade=True)) as client:

        async def writer(w: int) -> None:
            for i in range(limit):
                ack(f"start {w}-{i}-create")
                created = await client.call("session.create", title=f"traced {w}-{i}")
                ack(f"ack {w}-{i}-create")
                assert isinstance(created, session_pb2.CreateSessionResponse)
                ack(f"start {w}-{i}-tell")
                await client.call("session.tell", session_id=created.session.meta.id, content="hi")
                ack(f"ack {w}-{i}-tell")

        await asyncio.gather(*(writer(w) for w in range(writers)))


if __name__ == "__main__":
    mode, db, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if mode == "store":
        write_store(db, count)
    elif mode == "traced":
        asyncio.run(call_traced(db, count))
    elif mode == "concurrent":
        asyncio.run(call_concurrently(db, count))
    else:
        asyncio.run(call_facade(db, count))
