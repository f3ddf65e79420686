"""``agents`` commands ride over a server restart (issue 14, item 2): a real ``agents serve``
is stopped, ``agents`` commands (real subprocesses, over HTTP and gRPC) start and retry, the
server comes back on the same ports, and each command succeeds once. A server that dies after
a command's effect committed and before it answered: the command's retry (same request id)
gets the stored answer from the restarted server, and the effect happened once. Against a
server that never comes back, retrying ends: after the attempts, or at the deadline.
"""

from __future__ import annotations

import json
import pathlib
import re
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field

import pytest

from cleveragents.acp.facade.idempotency import KILL_AFTER_COMMIT_ENV
from tests.client.cli.conftest import CLI_TIMEOUT, clean_env
from tests.server_process import (
    START_TIMEOUT,
    ServerProcess,
    Tokens,
    agents_command,
    kill_group,
    start_server,
)

RETRYING = re.compile(
    r"^agents: no answer from the server \((.+)\); retrying in [0-9.]+ s \(attempt (\d+) of (\d+)\)$"
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Command:
    """One ``agents`` subprocess whose stdout and stderr are read as they come (threads)."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    out: list[str] = field(default_factory=list)
    retrying: threading.Event = field(default_factory=threading.Event)
    readers: list[threading.Thread] = field(default_factory=list)

    @classmethod
    def start(cls, args: list[str], env: dict[str, str], cwd: pathlib.Path) -> Command:
        process = subprocess.Popen(
            agents_command(*args),
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        command = cls(process)
        command.readers = [
            threading.Thread(target=command._read_err, daemon=True),
            threading.Thread(target=command._read_out, daemon=True),
        ]
        for reader in command.readers:
            reader.start()
        return command

    def _read_err(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))
            if RETRYING.match(line.rstrip("\n")):
                self.retrying.set()

    def _read_out(self) -> None:
        assert self.process.stdout is not None
        self.out.append(self.process.stdout.read())

    def finish(self) -> tuple[int, str]:
        try:
            self.process.wait(timeout=CLI_TIMEOUT + START_TIMEOUT)
        except subprocess.TimeoutExpired:
            kill_group(self.process)
            raise AssertionError(f"agents did not finish: {self.lines}") from None
        self._close()
        return self.process.returncode, "".join(self.out)

    def kill(self) -> None:
        if self.process.poll() is None:
            kill_group(self.process)
        self._close()

    def _close(self) -> None:
        for reader in self.readers:
            reader.join(CLI_TIMEOUT)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


def _env(tmp_path: pathlib.Path, tokens: Tokens, **settings: str) -> dict[str, str]:
    env = clean_env(tmp_path)
    env["ACP_TOKEN"] = tokens.tokens["alice"]
    env.update(settings)
    return env


def test_commands_ride_over_a_server_restart(tmp_path: pathlib.Path) -> None:
    tokens = Tokens.create(tmp_path)
    http_port, grpc_port = _free_port(), _free_port()
    ports = ("--http-port", str(http_port), "--grpc-port", str(grpc_port))
    server = start_server(tmp_path, *ports, tokens=tokens.path)
    where = {"http": ["--server", server.http], "grpc": ["--grpc", server.grpc_target]}
    assert server.stop() == 0, server.stderr()
    # Enough patience for a restart on a loaded machine; the attempts never run out first.
    env = _env(tmp_path, tokens, ACP_RETRY_ATTEMPTS="10000", ACP_RETRY_SECONDS=str(3 * START_TIMEOUT))
    create = ["session", "create", "--value", "session.meta.id", "--title"]
    commands = {
        wire: Command.start([*create, f"over {wire}", *flags], env, tmp_path) for wire, flags in where.items()
    }
    try:
        for wire, command in commands.items():
            assert command.retrying.wait(CLI_TIMEOUT), (wire, command.lines, command.process.poll())
        server = start_server(tmp_path, *ports, tokens=tokens.path)
        try:
            created = {}
            for wire, command in commands.items():
                status, out = command.finish()
                assert status == 0, (wire, command.lines)
                created[wire] = out.strip()
                reasons = {match.group(1) for line in command.lines if (match := RETRYING.match(line))}
                assert reasons, command.lines
                assert all("refused" in reason.lower() for reason in reasons), command.lines
            # Each command's session, exactly once: a refused connection never sent anything.
            assert _sessions(server, env) == {created["http"]: "over http", created["grpc"]: "over grpc"}
        finally:
            assert server.stop() == 0, server.stderr()
    finally:
        for command in commands.values():
            command.kill()


def _sessions(server: ServerProcess, env: dict[str, str]) -> dict[str, str]:
    listing = subprocess.run(
        agents_command("session", "list", "--json", "--server", server.http),
        env=env,
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT,
        check=True,
    )
    return {s["meta"]["id"]: s["title"] for s in json.loads(listing.stdout)["sessions"]}


@pytest.mark.parametrize("wire", ["http", "grpc"])
def test_a_command_rides_over_a_crash_after_its_effect_committed(tmp_path: pathlib.Path, wire: str) -> None:
    tokens = Tokens.create(tmp_path)
    http_port, grpc_port = _free_port(), _free_port()
    ports = ("--http-port", str(http_port), "--grpc-port", str(grpc_port))
    # The test hook of docs/idempotency.md: the server SIGKILLs itself once session.create
    # committed, before its answer is stored or sent.
    server = start_server(tmp_path, *ports, tokens=tokens.path, env={KILL_AFTER_COMMIT_ENV: "session.create"})
    flags = ["--server", server.http] if wire == "http" else ["--grpc", server.grpc_target]
    env = _env(tmp_path, tokens, ACP_RETRY_ATTEMPTS="10000", ACP_RETRY_SECONDS=str(3 * START_TIMEOUT))
    command = Command.start(
        ["session", "create", "--title", "once", "--value", "session.meta.id", *flags], env, tmp_path
    )
    restarted: ServerProcess | None = None
    try:
        assert server.process.wait(CLI_TIMEOUT) == -9, server.stderr()
        server.stop()
        assert command.retrying.wait(CLI_TIMEOUT), (command.lines, command.process.poll())
        restarted = start_server(tmp_path, *ports, tokens=tokens.path)
        status, out = command.finish()
        assert status == 0, command.lines
        # The first failure was the connection lost after sending; later ones, refused.
        assert any(m and "refused" not in m.group(1).lower() for m in map(RETRYING.match, command.lines))
        # One session: the committed one, answered to the retry from the stored request.
        assert _sessions(restarted, env) == {out.strip(): "once"}
    finally:
        command.kill()
        if server.process.poll() is None:
            kill_group(server.process)
        if restarted is not None:
            assert restarted.stop() == 0, restarted.stderr()


@pytest.mark.parametrize("wire", ["http", "grpc"])
def test_retrying_a_server_that_never_returns_is_bounded(tmp_path: pathlib.Path, wire: str) -> None:
    tokens = Tokens.create(tmp_path)
    port = _free_port()
    flags = ["--server", f"http://127.0.0.1:{port}"] if wire == "http" else ["--grpc", f"127.0.0.1:{port}"]
    by_attempts = Command.start(
        ["session", "create", *flags], _env(tmp_path, tokens, ACP_RETRY_ATTEMPTS="3"), tmp_path
    )
    status, out = by_attempts.finish()
    assert (status, out) == (12, "")
    *retries, last = by_attempts.lines
    assert [RETRYING.match(line).group(2, 3) for line in retries] == [("2", "3"), ("3", "3")]  # type: ignore[union-attr]
    assert last.startswith("UNAVAILABLE: cannot reach the ACP server at "), last
    assert last.endswith("; 3 attempts)"), last

    # Many attempts allowed, one second of retrying: the deadline ends it long before.
    started = time.monotonic()
    by_deadline = Command.start(
        ["session", "list", *flags],
        _env(tmp_path, tokens, ACP_RETRY_ATTEMPTS="10000", ACP_RETRY_SECONDS="1"),
        tmp_path,
    )
    status, _ = by_deadline.finish()
    assert status == 12, by_deadline.lines
    attempts = int(re.findall(r"; (\d+) attempts\)$", by_deadline.lines[-1])[0])
    assert 2 <= attempts < 20, (attempts, time.monotonic() - started)

    off = Command.start(["session", "list", *flags], _env(tmp_path, tokens, ACP_RETRY_ATTEMPTS="1"), tmp_path)
    assert off.finish()[0] == 12
    assert len(off.lines) == 1, off.lines
    assert "attempts" not in off.lines[0], off.lines


def test_bad_retry_settings_are_usage_errors(tmp_path: pathlib.Path) -> None:
    tokens = Tokens.create(tmp_path)
    for bad in ({"ACP_RETRY_ATTEMPTS": "0"}, {"ACP_RETRY_ATTEMPTS": "many"}, {"ACP_RETRY_SECONDS": "-1"}):
        command = Command.start(
            ["session", "list", "--server", "http://127.0.0.1:9"], _env(tmp_path, tokens, **bad), tmp_path
        )
        assert command.finish() == (2, ""), command.lines
        assert command.lines[-1].startswith("agents: error: retry settings:"), command.lines
