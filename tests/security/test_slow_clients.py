"""Slow clients do not get legitimate ones refused (issue 31, failure 8), on a real
``agents serve``.

2,100 unauthenticated connections trickling their headers from 9 addresses used to fill
``--max-connections`` and get 20 of 25 legitimate newcomers refused (429). Now a newcomer
over the cap closes the oldest idle connection of the address holding the most: here four
loopback addresses (127.0.0.2-5) fill a small cap with half-sent requests, 127.0.0.2 with
the most, and every request of a client on 127.0.0.1 is answered while only 127.0.0.2
loses connections. Connections that send their headers and then trickle a body used to
be out of reach (their request is under way): 40 of them got 5 of 5 newcomers refused. Now
a newcomer closes, of the address holding the most, the body furthest behind the minimum
rate, with an answer; and a body behind that rate past its grace is answered and closed
on its own. Raw sockets; every wait bounded by a deadline far above what it needs.
"""

from __future__ import annotations

import contextlib
import json
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


# The head of a request whose body never comes (or comes a byte at a time).
SLOW_BODY = (
    b"POST /api/v1/acp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
)

# The details of the answer to a body behind the minimum rate (240 bytes a second).
TOO_SLOW = {"field": "request", "min_bytes_per_second": 240, "refinement": "REQUEST_TIMEOUT"}


def _serve(tmp_path: pathlib.Path, *extra: str) -> Iterator[ServerProcess]:
    tokens = Tokens.create(tmp_path)
    # Timeouts far above the test's length: slow and kept-alive clients stay for all of it.
    server = start_server(
        tmp_path,
        *("--max-connections", str(CAP), "--max-connections-per-client", str(CAP // 2)),
        *("--header-timeout", "120", "--idle-timeout", "120", "--body-timeout", "120"),
        *extra,
        tokens=tokens.path,
    )
    try:
        yield server
    finally:
        assert server.stop() == 0, server.stderr()


@pytest.fixture
def server(tmp_path: pathlib.Path) -> Iterator[ServerProcess]:
    # The rate's grace past the test's length too: only a newcomer ends a slow body here.
    yield from _serve(tmp_path, "--min-body-rate-grace", "120")


@pytest.fixture
def quick_server(tmp_path: pathlib.Path) -> Iterator[ServerProcess]:
    yield from _serve(tmp_path, "--min-body-rate-grace", "1")


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


def _ended(socks: list[socket.socket]) -> list[socket.socket]:
    """Those the server answered or closed (readable: a slow client is sent nothing else),
    without waiting."""
    readable, _, _ = select.select(socks, [], [], 0)
    return readable


def _refusal(answer: bytes) -> tuple[bytes, dict[str, object]]:
    """The status line and the envelope's error details of an answer."""
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n", 1)[0], json.loads(body)["error"]["details"]


@pytest.mark.parametrize("sends", ["headers", "body"])
def test_slow_clients_from_several_addresses_get_no_legitimate_client_refused(
    server: ServerProcess, sends: str
) -> None:
    slow = {source: [_connect(server, source) for _ in range(count)] for source, count in SLOW.items()}
    kept: list[socket.socket] = []
    try:
        for socks in slow.values():
            for sock in socks:
                if sends == "headers":
                    sock.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")
                else:
                    # Headers, then a body trickled a byte at a time: its request is under way.
                    sock.sendall(SLOW_BODY)
                    sock.sendall(b"{")
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
        while len(_ended(most)) < LEGITIMATE and time.monotonic() < deadline:
            select.select(most, [], [], 0.1)
        ended = _ended(most)
        assert len(ended) == LEGITIMATE
        # The other addresses kept all theirs.
        for source in ("127.0.0.3", "127.0.0.4", "127.0.0.5"):
            assert _ended(slow[source]) == [], source
        if sends == "headers":
            # The oldest went first, without an answer.
            assert set(ended) == set(most[:LEGITIMATE])
            assert all(sock.recv(1) == b"" for sock in ended)
        else:
            # The furthest behind (about the oldest: one may have sent a byte more), answered.
            for sock in ended:
                status, details = _refusal(_answer(sock))
                assert status == b"HTTP/1.1 422 Unprocessable Entity"
                assert details == TOO_SLOW
    finally:
        for sock in [*kept, *(sock for socks in slow.values() for sock in socks)]:
            sock.close()


def test_a_body_behind_the_minimum_rate_is_answered_and_closed_after_its_grace(
    quick_server: ServerProcess,
) -> None:
    """Not full, and well within the body timeout: the rate alone ends it."""
    sock = _connect(quick_server, "127.0.0.2")
    try:
        sock.sendall(SLOW_BODY)
        sock.sendall(b"{")
        status, details = _refusal(_answer(sock))
        assert status == b"HTTP/1.1 422 Unprocessable Entity"
        assert details == TOO_SLOW
    finally:
        sock.close()
