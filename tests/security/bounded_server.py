"""One real ``agents serve`` (token auth on) for the bounds tests of a module: import the
``bounded`` fixture into the test module."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from tests.server_process import ServerProcess, Tokens, start_server

MAX_BODY = 256 * 1024


@dataclass
class Bounded:
    server: ServerProcess
    tokens: Tokens
    directory: pathlib.Path

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens.tokens['alice']}"}

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.server.http, timeout=10, headers=self.auth)


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bounded]:
    directory = tmp_path_factory.mktemp("bounds")
    tokens = Tokens.create(directory)
    server = start_server(directory, "--max-body-bytes", str(MAX_BODY), tokens=tokens.path)
    try:
        yield Bounded(server, tokens, directory)
    finally:
        assert server.stop() == 0, server.stderr()
