"""One real server for the gateway tests (package scope: started once, stopped cleanly)."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.server_process import ServerProcess, Tokens, start_server

MAX_BODY = 64 * 1024


@dataclass
class Served:
    server: ServerProcess
    tokens: Tokens
    directory: pathlib.Path

    def token(self, name: str = "alice") -> str:
        return self.tokens.tokens[name]


@pytest.fixture(scope="package")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("served")
    tokens = Tokens.create(directory)
    server = start_server(directory, "--max-body-bytes", str(MAX_BODY), tokens=tokens.path)
    yield Served(server, tokens, directory)
    assert server.stop() == 0, server.stderr()
