"""Idle HTTP/2 connections from one client do not stop another (issue 31, failure 4), on a
real ``agents serve`` whose file-descriptor limit is low (256), as the attack's 20,000
connections found it.

300 connections from 127.0.0.2 each send the HTTP/2 preface and nothing more. Before the
fix the gRPC port took them all, the server ran out of descriptors and neither port
answered anyone. Now the gRPC core holds at most ``--max-connections`` and the connection
guard shuts down what one address holds past ``--max-connections-per-client``, so a
client on 127.0.0.1 is answered on both ports. Waits are bounded by generous deadlines.

Then the same from connections that each make one call with no credential (answered
UNAUTHENTICATED): a call counted as a caller's before it was authenticated, so such
connections were exempt from the per-client cap and filled the core's cap (40), and the
client on 127.0.0.1 was not answered within the deadline.
"""

from __future__ import annotations

import contextlib
import pathlib
import resource
import socket
from collections.abc import Callable, Iterator

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cleveragents.acp.contract import catalog
from tests.server_process import ServerProcess, Tokens, start_server

DESCRIPTORS = 256
ATTACK = 300
DEADLINE = 30.0
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


@pytest.fixture
def server(tmp_path: pathlib.Path) -> Iterator[ServerProcess]:
    tokens = Tokens.create(tmp_path)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # The child inherits the low limit; this process gets its own back at once.
    resource.setrlimit(resource.RLIMIT_NOFILE, (DESCRIPTORS, hard))
    try:
        server = start_server(
            tmp_path,
            *("--max-connections", "40", "--max-connections-per-client", "10", "--header-timeout", "3"),
            tokens=tokens.path,
        )
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        yield server
    finally:
        assert server.stop() == 0, server.stderr()


def _attack(target: str) -> list[socket.socket]:
    host, _, port = target.rpartition(":")
    socks = []
    for _ in range(ATTACK):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.settimeout(DEADLINE)
        sock.bind(("127.0.0.2", 0))
        socks.append(sock)
        with contextlib.suppress(OSError):
            sock.connect((host, int(port)))
            sock.sendall(PREFACE)
    return socks


def _frame(kind: int, flags: int, payload: bytes, stream: int = 1) -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def _call_without_credential(sock: socket.socket, authority: str) -> None:
    """One HTTP/2 call of session.list with no token (HPACK literals), read to its end."""
    method = catalog.OPERATIONS["session.list"].full_method
    fields = {":method": "POST", ":scheme": "http", ":path": method, ":authority": authority}
    fields |= {"content-type": "application/grpc", "te": "trailers"}
    block = b"".join(b"\x00%c%s%c%s" % (len(k), k.encode(), len(v), v.encode()) for k, v in fields.items())
    sock.sendall(_frame(1, 0x4, block) + _frame(0, 0x1, b"\x00\x00\x00\x00\x00"))
    while True:
        head = sock.recv(9, socket.MSG_WAITALL)
        if len(head) < 9:
            return
        size, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
        if size:
            sock.recv(size, socket.MSG_WAITALL)
        if kind == 4 and not flags & 0x1:
            sock.sendall(_frame(4, 0x1, b"", 0))  # acknowledge the server's settings
        if kind == 1 and flags & 0x1 and int.from_bytes(head[5:9], "big") == 1:
            return  # the call's trailers


def _attack_calling(target: str) -> list[socket.socket]:
    socks = _attack(target)
    for sock in socks:
        with contextlib.suppress(OSError):
            _call_without_credential(sock, target)
    return socks


@pytest.mark.parametrize("attack", [_attack, _attack_calling], ids=["idle", "unauthenticated-calls"])
async def test_idle_connections_of_one_client_leave_another_answered(
    server: ServerProcess, attack: Callable[[str], list[socket.socket]]
) -> None:
    socks = attack(server.grpc_target)
    try:
        async with grpc.aio.insecure_channel(server.grpc_target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE, wait_for_ready=True)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
        async with httpx.AsyncClient(base_url=server.http, timeout=DEADLINE) as http:
            assert (await http.get("/healthz")).status_code == 200
    finally:
        for sock in socks:
            sock.close()


def test_a_connection_that_never_shakes_hands_is_closed(server: ServerProcess) -> None:
    """The gRPC core closes a connection that sends nothing at ``--header-timeout`` (3 s
    here; grpcio's own default, on main, was 120 s): the read sees the end, not the deadline."""
    host, _, port = server.grpc_target.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=DEADLINE) as sock:
        while sock.recv(4096):
            pass
