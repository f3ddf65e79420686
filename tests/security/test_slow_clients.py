"""Slow clients do not get legitimate ones refused (issue 31, failure 8), on a real
``agents serve``.

2,100 unauthenticated connections trickling their headers from 9 addresses used to fill
``--max-connections`` and get 20 of 25 legitimate newcomers refused (429). Now a newcomer
over the cap closes the oldest idle connection of the address holding the most: here four
loopback addresses (127.0.0.2-5) fill a small cap with half-sent requests, 127.0.0.2 with
the most, and every request of a client on 127.0.0.1 is answered while only 127.0.0.2
loses connections. Raw sockets; every wait bounded by a deadline far above what it needs.
"""

from __future__ import annotations

import contextlib
import pathlib
import select
import socket
import time
import urllib.parse
from collections.abc import Iterator

import pytest

from tests.server_process import ServerProcess, Tokens, start_server

CAP = 40
# Connections per slow address: 127.0.0.2 holds the most.
SLOW = {"127.0.0.2": 16, "127.0.0.3": 8, "127.0.0.4": 8, "127.0.0.5": 8}
LEGITIMATE = 5
DEADLINE = 30.0


@pytest.fixture
def server(tmp_path: pathlib.Path) -> Iterator[ServerProcess]:
    tokens = Tokens.create(tmp_path)
    # Timeouts far above the test's length: slow and kept-alive clients stay for all of it.
    server = start_server(
        tmp_path,
        *("--max-connections", str(CAP), "--max-connections-per-client", str(CAP // 2)),
        *("--header-timeout", "120", "--idle-timeout", "120"),
        tokens=tokens.path,
    )
    try:
        yield server
    finally:
        assert server.stop() == 0, server.stderr()


def _address(server: ServerProcess) -> tuple[str, int]:
    split = urllib.parse.urlsplit(server.http)
    return split.hostname or "127.0.0.1", split.port or 80


def _connect(server: ServerProcess, source: str) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(DEADLINE)
    sock.bind((source, 0))
    sock.connect(_address(server))
    return sock


def _answer(sock: socket.socket) -> bytes:
    """One whole answer (its head and its Content-Length of body); the connection stays."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
        length = int(fields.get(b"content-length", b"0"))
        while len(body) < length and (chunk := sock.recv(65536)):
            body += chunk
    return data


def _closed(socks: list[socket.socket]) -> list[socket.socket]:
    """Those the server closed (EOF or reset waiting), without waiting."""
    readable, _, _ = select.select(socks, [], [], 0)
    closed = []
    for sock in readable:
        try:
            if sock.recv(1, socket.MSG_PEEK) == b"":
                closed.append(sock)
        except ConnectionResetError:
            closed.append(sock)
    return closed


def test_slow_clients_from_several_addresses_get_no_legitimate_client_refused(server: ServerProcess) -> None:
    slow = {source: [_connect(server, source) for _ in range(count)] for source, count in SLOW.items()}
    kept: list[socket.socket] = []
    try:
        for socks in slow.values():
            for sock in socks:
                sock.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")
        answers = []
        for _ in range(LEGITIMATE):
            # Kept alive: each holds its place, so each needs one made for it.
            sock = _connect(server, "127.0.0.1")
            kept.append(sock)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            answers.append(_answer(sock))
        assert [answer.split(b"\r\n", 1)[0] for answer in answers] == [b"HTTP/1.1 200 OK"] * LEGITIMATE
        most = slow["127.0.0.2"]
        deadline = time.monotonic() + DEADLINE
        while len(_closed(most)) < LEGITIMATE and time.monotonic() < deadline:
            select.select(most, [], [], 0.1)
        assert len(_closed(most)) == LEGITIMATE
        # The oldest went first; the other addresses kept all theirs.
        assert set(_closed(most)) == set(most[:LEGITIMATE])
        for source in ("127.0.0.3", "127.0.0.4", "127.0.0.5"):
            assert _closed(slow[source]) == [], source
    finally:
        for sock in [*kept, *(sock for socks in slow.values() for sock in socks)]:
            sock.close()
