"""Issue 17, finding 9 (HTTP half): oversized headers, unreadable requests, slow clients
and too many connections are answered with ACP envelopes by the server's own HTTP protocol
and closed, on a real ``agents serve``; no connection stays open indefinitely.

Raw sockets, since HTTP client libraries refuse to send most of these. Every read is
bounded by a socket timeout, and every wait by a deadline far above the server's (1 s)."""

from __future__ import annotations

import contextlib
import pathlib
import socket
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from cleveragents.acp.contract.errors import http_status
from tests.server_process import ServerProcess, Tokens, start_server

SLOW = 300
CAP = SLOW + 20
DEADLINE = 30.0


def _server(directory: pathlib.Path, *extra: str) -> ServerProcess:
    tokens = Tokens.create(directory)
    return start_server(directory, *extra, tokens=tokens.path)


@pytest.fixture(scope="module")
def timeouts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = _server(
        tmp_path_factory.mktemp("timeouts"),
        *("--header-timeout", "1", "--body-timeout", "1", "--idle-timeout", "1"),
        *("--max-connections", str(CAP), "--max-connections-per-client", str(CAP + 10)),
    )
    try:
        yield server
    finally:
        assert server.stop() == 0, server.stderr()


def _connect(server: ServerProcess) -> socket.socket:
    address = urllib.parse.urlsplit(server.http)
    sock = socket.create_connection((address.hostname or "127.0.0.1", address.port or 80), timeout=10)
    sock.settimeout(DEADLINE)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything until the server closes (bounded by the socket timeout)."""
    data = b""
    with contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


def _envelope_error(answer: bytes, code: str) -> dict[str, Any]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {http_status(code)} "), answer[:300]
    headers = {name.lower(): value for name, _, value in (line.partition(": ") for line in lines[1:])}
    assert headers["content-type"] == "application/json"
    assert headers["connection"] == "close"
    envelope = orjson.loads(body)
    assert envelope["status"] == "error"
    assert envelope["request_id"] == headers["x-request-id"]
    assert envelope["error"]["code"] == code, envelope
    details: dict[str, Any] = envelope["error"]["details"]
    return details


def test_a_1_mb_header_is_an_envelope(timeouts: ServerProcess) -> None:
    with _connect(timeouts) as sock:
        sock.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n")
        details = _envelope_error(_read_all(sock), "INVALID_PARAMS")
    assert details == {"field": "headers", "max_bytes": 64 * 1024}


def test_an_unreadable_request_is_an_envelope(timeouts: ServerProcess) -> None:
    with _connect(timeouts) as sock:
        sock.sendall(b"NONSENSE\r\n\r\n")
        assert _envelope_error(_read_all(sock), "INVALID_PARAMS") == {"field": "request"}


def test_slow_headers_and_bodies_are_refused_and_closed(timeouts: ServerProcess) -> None:
    with _connect(timeouts) as sock:
        sock.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n")
        details = _envelope_error(_read_all(sock), "INVALID_PARAMS")
    assert details == {"field": "request", "timeout_seconds": 1, "refinement": "REQUEST_TIMEOUT"}
    with _connect(timeouts) as sock:
        sock.sendall(b'POST /api/v1/acp HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"op')
        details = _envelope_error(_read_all(sock), "INVALID_PARAMS")
    assert details == {"field": "request", "timeout_seconds": 1, "refinement": "REQUEST_TIMEOUT"}


def test_a_slow_request_after_an_answered_one_is_refused(timeouts: ServerProcess) -> None:
    """The deadline is armed again after each answer: the next request on a kept-alive
    connection, trickled byte by byte, is refused too."""
    with _connect(timeouts) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = b""
        while b'"SERVING"' not in first:
            chunk = sock.recv(65536)
            assert chunk, first
            first += chunk
        assert first.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /healthz HTTP/1.1\r\n")
        sock.setblocking(False)
        answer = b""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            with contextlib.suppress(BlockingIOError, BrokenPipeError, ConnectionResetError):
                sock.send(b"X")
            try:
                chunk = sock.recv(65536)
            except BlockingIOError:
                time.sleep(0.1)
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
    details = _envelope_error(answer, "INVALID_PARAMS")
    assert details == {"field": "request", "timeout_seconds": 1, "refinement": "REQUEST_TIMEOUT"}


def test_idle_connections_are_closed(timeouts: ServerProcess) -> None:
    with _connect(timeouts) as sock:
        assert _read_all(sock) == b""  # nothing sent: closed without an answer
    with _connect(timeouts) as sock:
        sock.sendall(b"GET /api/v1/health HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = _read_all(sock)  # answered, then closed once idle
    assert answer.startswith(b"HTTP/1.1 ")
    assert answer.count(b"HTTP/1.1 ") == 1


def test_hundreds_of_slowloris_connections_do_not_stay_open(timeouts: ServerProcess) -> None:
    """Each trickles a header byte by byte; all are answered and closed by the deadline."""
    socks = [_connect(timeouts) for _ in range(SLOW)]
    try:
        for sock in socks:
            sock.sendall(b"GET /api/v1/health HTTP/1.1\r\n")
            sock.setblocking(False)
        open_ = set(range(SLOW))
        answers: dict[int, bytes] = {index: b"" for index in open_}
        deadline = time.monotonic() + DEADLINE
        while open_ and time.monotonic() < deadline:
            for index in list(open_):
                with contextlib.suppress(BlockingIOError, BrokenPipeError, ConnectionResetError):
                    socks[index].send(b"X")
                try:
                    chunk = socks[index].recv(65536)
                except BlockingIOError:
                    continue
                except ConnectionResetError:
                    chunk = b""
                if chunk:
                    answers[index] += chunk
                else:
                    open_.discard(index)
            time.sleep(0.1)
        assert not open_, f"{len(open_)} of {SLOW} slow connections still open after {DEADLINE}s"
        refused = [index for index, answer in answers.items() if b"REQUEST_TIMEOUT" in answer]
        assert len(refused) >= SLOW * 0.9, len(refused)
    finally:
        for sock in socks:
            sock.close()


def _refused_over(server: ServerProcess, cap: int, scope: bytes, *, busy: bool = False) -> None:
    """``cap`` connections held (``busy``: each in a request whose body the server is
    reading: it said ``100 Continue``), then one more is refused."""
    held = [_connect(server) for _ in range(cap)]
    if busy:
        for sock in held:
            sock.sendall(
                b"POST /api/v1/acp HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nExpect: 100-continue\r\n\r\n"
            )
        for sock in held:
            assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue\r\n")
    try:
        with _connect(server) as sock:
            answer = _read_all(sock)
        details = _envelope_error(answer, "BUDGET_EXCEEDED")
        assert details == {"max_connections": cap, "refinement": "TOO_MANY_CONNECTIONS"}
        assert scope in answer
    finally:
        for sock in held:
            sock.close()


def test_connections_over_the_server_cap_are_refused_when_none_is_idle(tmp_path: pathlib.Path) -> None:
    """Idle ones, and bodies behind the minimum rate, make room instead
    (tests/security/test_slow_clients.py); with no minimum rate and the default timeouts,
    every held request stays under way, and keeps its place, for the whole test."""
    server = _server(
        tmp_path, "--max-connections", "20", "--max-connections-per-client", "30", "--min-body-rate", "0"
    )
    try:
        _refused_over(server, 20, b"to the server", busy=True)
    finally:
        assert server.stop() == 0, server.stderr()


def test_connections_over_the_per_client_cap_are_refused(tmp_path: pathlib.Path) -> None:
    server = _server(tmp_path, "--max-connections-per-client", "3")
    try:
        _refused_over(server, 3, b"to one client address")
    finally:
        assert server.stop() == 0, server.stderr()
