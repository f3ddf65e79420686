"""Three ``agents serve`` replicas on loopback ports over one PostgreSQL schema: writes through
each, a subscriber on each (gRPC on one, HTTP/SSE on the others), and every subscriber gets
every event, in sequence order, once. One replica is SIGKILLed while the others keep writing
and started again; its subscriber resumes there from the last sequence it saw (the sequence is
the database's, so any replica can resume it) and misses nothing."""

from __future__ import annotations

import asyncio
import pathlib
import signal
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.store.postgres import PostgresStore
from cleveragents.acp.v1 import session_pb2
from tests.server_process import ServerProcess, Tokens, kill_group, start_server

TIMEOUT = 90.0
TELLS = 4


class Replicas:
    def __init__(self, directory: pathlib.Path, url: str) -> None:
        self.directory = directory
        self.url = url
        self.tokens = Tokens.create(directory)
        self.servers: list[ServerProcess] = []
        self.clients: list[ACPClient] = []

    def start(self, index: int) -> ServerProcess:
        server = start_server(
            self.directory,
            "--db",
            self.url,
            tokens=self.tokens.path,
            name=f"replica{index}-{len(self.servers)}",
        )
        self.servers.append(server)
        return server

    def client(self, server: ServerProcess, principal: str, *, grpc: bool = False) -> ACPClient:
        token = self.tokens.tokens[principal]
        if grpc:
            client = ACPClient(GrpcTransport.connect(server.grpc_target, timeout=TIMEOUT), token=token)
        else:
            http = httpx.AsyncClient(base_url=server.http, timeout=httpx.Timeout(TIMEOUT))
            client = ACPClient(HTTPTransport(http, owns_client=True), token=token)
        self.clients.append(client)
        return client


@pytest.fixture
def replicas(tmp_path: pathlib.Path, pg_url: str) -> Iterator[Replicas]:
    made = Replicas(tmp_path, pg_url)
    try:
        yield made
    finally:
        for server in made.servers:
            if server.process.poll() is None:
                kill_group(server.process)
            if server.process.stdout is not None:
                server.process.stdout.close()


@pytest.fixture
async def closing(replicas: Replicas) -> AsyncIterator[None]:
    yield
    for client in replicas.clients:
        await client.close()


class Seen:
    """The sequences one subscriber received, and a condition to wait for one of them."""

    def __init__(self) -> None:
        self.sequences: list[int] = []
        self.changed = asyncio.Condition()

    async def add(self, sequence: int) -> None:
        async with self.changed:
            self.sequences.append(sequence)
            self.changed.notify_all()

    async def reach(self, sequence: int) -> None:
        async with self.changed:
            await self.changed.wait_for(lambda: bool(self.sequences) and self.sequences[-1] >= sequence)


async def follow(client: ACPClient, seen: Seen) -> None:
    """Collect sequences from after the last one seen, until cancelled (or the stream fails)."""
    after = seen.sequences[-1] if seen.sequences else 0
    async for event in client.subscribe(after_sequence=after):
        await seen.add(event.sequence)


async def converse(client: ACPClient, title: str) -> None:
    created = await client.call("session.create", title=title)
    assert isinstance(created, session_pb2.CreateSessionResponse)
    for index in range(TELLS):
        await client.call("session.tell", session_id=created.session.meta.id, content=f"{title} {index}")


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("closing")
async def test_every_replica_delivers_every_event_in_order_across_a_restart(replicas: Replicas) -> None:
    servers = [replicas.start(index) for index in range(3)]
    writers = [replicas.client(server, "alice") for server in servers]
    readers = [
        replicas.client(servers[0], "root"),
        replicas.client(servers[1], "root", grpc=True),
        replicas.client(servers[2], "root"),
    ]
    seen = [Seen() for _ in readers]
    following = [asyncio.create_task(follow(reader, seen[i])) for i, reader in enumerate(readers)]

    # Every subscriber is attached and hears a write made through another replica.
    await converse(writers[0], "first")
    for subscriber in seen:
        await asyncio.wait_for(subscriber.reach(1), TIMEOUT)

    # Writes through all three at once.
    await asyncio.gather(*(converse(writer, f"replica{i}") for i, writer in enumerate(writers)))

    # Replica 2 dies while the others keep writing, and comes back on the same database.
    flowing = asyncio.gather(converse(writers[0], "during-a"), converse(writers[1], "during-b"))
    servers[2].process.send_signal(signal.SIGKILL)
    servers[2].process.wait(TIMEOUT)
    with pytest.raises(ACPError):
        await asyncio.wait_for(following[2], TIMEOUT)
    restarted = replicas.start(2)
    following[2] = asyncio.create_task(follow(replicas.client(restarted, "root"), seen[2]))
    await flowing
    await converse(replicas.client(restarted, "alice"), "after-restart")

    store = PostgresStore(replicas.url)
    try:
        stored = [event.sequence for event in store.read_events(0, 100_000)]
    finally:
        store.close()
    assert stored == list(range(1, len(stored) + 1))
    try:
        for subscriber in seen:
            await asyncio.wait_for(subscriber.reach(stored[-1]), TIMEOUT)
    finally:
        for task in following:
            task.cancel()
        await asyncio.gather(*following, return_exceptions=True)
    for index, subscriber in enumerate(seen):
        assert subscriber.sequences == stored, f"replica {index}'s subscriber"
    for server in (servers[0], servers[1], restarted):
        assert server.stop() == 0, server.stderr()
