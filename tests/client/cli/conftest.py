"""The ``agents`` CLI as a real subprocess, in local mode and against one real server
(HTTP and gRPC) shared by the CLI tests."""

from __future__ import annotations

import os
import pathlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.server_process import ServerProcess, Tokens, agents_command, start_server

CLI_TIMEOUT = 60.0
MODES = ["local", "http", "grpc"]
# How `agents` says it retries a call the server left unanswered (client/cli/calls.py): under
# load such a notice may come before the call's own answer on stderr.
RETRY_NOTICE = "agents: no answer from the server ("


@dataclass(frozen=True)
class Result:
    status: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"exit {self.status}\n--- stdout\n{self.out}\n--- stderr\n{self.err}"

    @property
    def error(self) -> str:
        """The call's error: the last line of stderr, every line before it a retry notice."""
        lines = self.err.splitlines()
        assert lines, f"nothing on stderr\n{self}"
        assert all(line.startswith(RETRY_NOTICE) for line in lines[:-1]), self
        return lines[-1]


def clean_env(home: pathlib.Path) -> dict[str, str]:
    """The environment without the caller's ACP_* settings, with config and data under
    ``home`` so no real profile or database is touched."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACP_")}
    env["XDG_CONFIG_HOME"] = str(home / "config")
    env["XDG_DATA_HOME"] = str(home / "data")
    return env


@dataclass
class Cli:
    """Runs ``agents`` with a fixed connection (from the environment) and checks the exit
    status; output is never a terminal here, so it must carry no colour."""

    mode: str
    env: dict[str, str]
    cwd: pathlib.Path

    def __call__(self, *args: str, stdin: str | None = None, expect: int | None = 0) -> Result:
        done = subprocess.run(
            agents_command(*args),
            env=self.env,
            cwd=self.cwd,
            input=stdin,
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT,
        )
        result = Result(done.returncode, done.stdout, done.stderr)
        if expect is not None:
            assert result.status == expect, f"agents {' '.join(args)}\n{result}"
        assert "Traceback" not in result.err, result
        assert "\x1b[" not in result.out, result
        return result


@pytest.fixture(scope="session")
def cli_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Tokens]]:
    directory = tmp_path_factory.mktemp("cli-server")
    tokens = Tokens.create(directory)
    server = start_server(directory, tokens=tokens.path)
    yield server, tokens
    assert server.stop() == 0, server.stderr()


def make_cli(mode: str, tmp_path: pathlib.Path, remote: tuple[ServerProcess, Tokens] | None) -> Cli:
    env = clean_env(tmp_path)
    if mode == "local":
        env["ACP_DB"] = str(tmp_path / "local.db")
    else:
        assert remote is not None
        server, tokens = remote
        env["ACP_TOKEN"] = tokens.tokens["root"]
        if mode == "http":
            env["ACP_SERVER"] = server.http
        else:
            env["ACP_GRPC"] = server.grpc_target
    return Cli(mode, env, tmp_path)


@pytest.fixture(params=MODES)
def cli(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Cli:
    """The CLI in each mode: local on a fresh database, or against the shared server."""
    remote = request.getfixturevalue("cli_server") if request.param != "local" else None
    return make_cli(request.param, tmp_path, remote)


@pytest.fixture
def local_cli(tmp_path: pathlib.Path) -> Cli:
    return make_cli("local", tmp_path, None)
