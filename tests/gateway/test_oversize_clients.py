"""A body over ``--max-body-bytes`` is answered with the INVALID_PARAMS envelope, and every
common client reads it (issue 14, item 3): Python's ``urllib`` (which sends ``Connection:
close`` and reads only after sending all), ``http.client``, ``httpx`` and curl, each sending a
6 MiB body, over plain HTTP and over TLS, to a real ``agents serve``.

The server answers from the declared length without reading the body; it then reads and
drops the rest before it closes (``gateway/http/protocol.py``), else the kernel would reset a
connection with unread data and a client still sending would never see the answer. The route
is ``session.create``'s (``POST /api/v1/sessions``): the envelope endpoint reads bodies up to
the size of a whole session export (``session.import``) before it refuses another operation's."""

from __future__ import annotations

import http.client
import pathlib
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import orjson
import pytest

from tests import needs
from tests.gateway.conftest import MAX_BODY, Served
from tests.server_process import Tokens, start_server
from tests.tls import make_certificate

BODY = orjson.dumps({"title": "x" * (6 * 1024 * 1024)})
PATH = "/api/v1/sessions"
HEADERS = {"Content-Type": "application/json"}
TIMEOUT = 60.0


@dataclass(frozen=True)
class Target:
    url: str
    # The CA to trust (TLS), or None (plain HTTP).
    ca: pathlib.Path | None

    def context(self) -> ssl.SSLContext | None:
        return ssl.create_default_context(cafile=str(self.ca)) if self.ca else None


@pytest.fixture(scope="module")
def tls_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    directory = tmp_path_factory.mktemp("oversize-tls")
    cert, key = make_certificate(directory)
    tokens = Tokens.create(directory)
    tls = ("--tls-cert", str(cert), "--tls-key", str(key))
    server = start_server(directory, "--max-body-bytes", str(MAX_BODY), *tls, tokens=tokens.path, name="tls")
    try:
        yield Target(server.http, cert)
    finally:
        assert server.stop() == 0, server.stderr()


@pytest.fixture(params=["http", "https"])
def target(request: pytest.FixtureRequest, served: Served) -> Target:
    if request.param == "http":
        return Target(served.server.http, None)
    found: Target = request.getfixturevalue("tls_target")
    return found


def with_urllib(target: Target) -> tuple[int, bytes]:
    request = urllib.request.Request(target.url + PATH, data=BODY, headers=HEADERS, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT, context=target.context()) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as answer:
        return answer.code, answer.read()


def with_http_client(target: Target) -> tuple[int, bytes]:
    address = urllib.parse.urlsplit(target.url)
    connection: http.client.HTTPConnection
    if target.ca:
        connection = http.client.HTTPSConnection(
            address.hostname or "", address.port, timeout=TIMEOUT, context=target.context()
        )
    else:
        connection = http.client.HTTPConnection(address.hostname or "", address.port, timeout=TIMEOUT)
    try:
        connection.request("POST", PATH, body=BODY, headers=HEADERS)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def with_httpx(target: Target) -> tuple[int, bytes]:
    verify: Any = target.context() or True
    with httpx.Client(timeout=TIMEOUT, verify=verify) as client:
        response = client.post(target.url + PATH, content=BODY, headers=HEADERS)
        return response.status_code, response.content


def with_curl(target: Target, directory: pathlib.Path) -> tuple[int, bytes]:
    curl = needs.program("curl")
    body = directory / "body.json"
    body.write_bytes(BODY)
    answer = directory / "answer.json"
    command = [curl, "-sS", "--max-time", str(int(TIMEOUT)), "-o", str(answer), "-w", "%{http_code}"]
    command += ["-H", "Content-Type: application/json", "--data-binary", f"@{body}"]
    if target.ca:
        command += ["--cacert", str(target.ca)]
    done = subprocess.run([*command, target.url + PATH], capture_output=True, text=True, timeout=TIMEOUT + 10)
    assert done.returncode == 0, done.stderr
    return int(done.stdout), answer.read_bytes()


CLIENTS: dict[str, Callable[[Target, pathlib.Path], tuple[int, bytes]]] = {
    "urllib": lambda target, _: with_urllib(target),
    "http.client": lambda target, _: with_http_client(target),
    "httpx": lambda target, _: with_httpx(target),
    "curl": with_curl,
}


@pytest.mark.parametrize("client", list(CLIENTS))
def test_every_client_reads_the_over_size_envelope(
    client: str, target: Target, tmp_path: pathlib.Path
) -> None:
    status, body = CLIENTS[client](target, tmp_path)
    assert status == 422, body[:300]
    answer = orjson.loads(body)
    assert answer["status"] == "error"
    assert answer["error"]["code"] == "INVALID_PARAMS"
    assert answer["error"]["details"] == {"field": "body", "max_bytes": MAX_BODY}
    assert str(len(BODY)) in answer["error"]["message"]
