"""Idle HTTP/2 connections from one client do not stop another (issue 31, failure 4), on a
real ``agents serve`` whose file-descriptor limit is low (256), as the attack's 20,000
connections found it.

300 connections from 127.0.0.2 each send the HTTP/2 preface and nothing more. Before the
fix the gRPC port took them all, the server ran out of descriptors and neither port
answered anyone. Now the gRPC core holds at most ``--max-connections`` and the connection
guard shuts down what one address holds past ``--max-connections-per-client``, so a
client on 127.0.0.1 is answered on both ports. Waits are bounded by generous deadlines.
"""

from __future__ import annotations

import contextlib
import pathlib
import resource
import socket
from collections.abc import Iterator

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

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
            tmp_path, "--max-connections", "40", "--max-connections-per-client", "10", tokens=tokens.path
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


async def test_idle_connections_of_one_client_leave_another_answered(server: ServerProcess) -> None:
    socks = _attack(server.grpc_target)
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
