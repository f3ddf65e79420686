"""The gRPC connection guard's policy (``gateway/grpc/connections.py``) on real sockets of
this process: a listening socket stands for the gRPC core's, connections come from
several loopback addresses, and one ``sweep`` must shut down exactly what the policy says."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from cleveragents.acp.gateway.grpc.connections import ConnectionGuard
from cleveragents.acp.gateway.http.protocol import ConnectionLimits


class Port:
    """A listening socket and the connections made to it (client side, server side)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.pairs: list[tuple[socket.socket, socket.socket]] = []

    def connect(self, source: str) -> str:
        client = socket.socket()
        client.bind((source, 0))
        client.connect(("127.0.0.1", self.port))
        accepted, _ = self.listener.accept()
        self.pairs.append((client, accepted))
        host, port = client.getsockname()
        return f"{host}:{port}"

    def close(self) -> None:
        for client, accepted in self.pairs:
            client.close()
            accepted.close()
        self.listener.close()


@pytest.fixture
def port() -> Iterator[Port]:
    made = Port()
    try:
        yield made
    finally:
        made.close()


def guard(port: Port, total: int, per_client: int) -> ConnectionGuard:
    made = ConnectionGuard(ConnectionLimits(max_connections=total, max_connections_per_client=per_client))
    made.port = port.port
    return made


def test_an_address_over_its_cap_loses_its_newest_uncalled_connections(port: Port) -> None:
    peers = [port.connect("127.0.0.2") for _ in range(5)]
    other = [port.connect("127.0.0.3") for _ in range(2)]
    sweeping = guard(port, total=100, per_client=3)
    # The newest connection made a call: it stays, the two before it go.
    sweeping.saw(f"ipv4:{peers[4]}")
    assert sorted(sweeping.sweep()) == sorted([peers[2], peers[3]])
    assert sweeping.sweep() == []
    for index, (client, _) in enumerate(port.pairs):
        if index in (2, 3):
            client.settimeout(5)
            assert client.recv(1) == b"", index
        else:
            assert still_open(client), index
    assert len(other) == 2


def still_open(client: socket.socket) -> bool:
    """Nothing to read and no end seen (the guard's shutdown is synchronous: its FIN is
    already here when ``sweep`` returns)."""
    client.setblocking(False)
    try:
        client.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    return False


def test_uncalled_connections_keep_room_for_callers(port: Port) -> None:
    first = [port.connect("127.0.0.2") for _ in range(3)]
    for source in ("127.0.0.3", "127.0.0.4"):
        for _ in range(2):
            port.connect(source)
    # 7 uncalled connections, room for 8 - 8 // 8 = 7: nothing to do.
    sweeping = guard(port, total=8, per_client=10)
    assert sweeping.sweep() == []
    port.connect("127.0.0.4")
    # 8 uncalled: the oldest of the most-connected address (127.0.0.2) goes.
    assert sweeping.sweep() == [first[0]]
