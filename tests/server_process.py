"""The real ``agents serve`` / ``agents gateway`` in a subprocess on ephemeral loopback ports.

Tests wait for its ``acp-ready`` line (bounded), talk to it over the network, and stop it
with SIGTERM, which must end it cleanly (exit status 0).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cleveragents.acp.facade import auth

START_TIMEOUT = 60.0  # a busy 2-core box (8 suites at once) can need 20 s and more
STOP_TIMEOUT = 15.0


@dataclass
class Tokens:
    """A token file with principals for the auth matrix (admins: the contract suite
    registers command tools; tests/security holds the role matrix)."""

    path: pathlib.Path
    tokens: dict[str, str] = field(default_factory=dict)

    @classmethod
    def create(cls, directory: pathlib.Path) -> Tokens:
        path = directory / "tokens.toml"
        made = cls(path)
        made.tokens["alice"] = auth.create_token(path, "alice", ["default"], role="admin")
        made.tokens["bob"] = auth.create_token(path, "bob", ["other"], role="admin")
        made.tokens["root"] = auth.create_token(path, "root", None, role="admin")
        return made


@dataclass
class ServerProcess:
    process: subprocess.Popen[bytes]
    http: str
    grpc: str | None
    stdout: list[str]
    stderr_path: pathlib.Path

    @property
    def grpc_target(self) -> str:
        assert self.grpc is not None
        return self.grpc

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            status = self.process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            kill_group(self.process)
            raise AssertionError(f"server did not stop in {STOP_TIMEOUT}s: {self.stderr()}") from None
        if self.process.stdout is not None:
            self.process.stdout.close()
        return status

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")


def kill_group(process: subprocess.Popen[Any]) -> None:
    """SIGKILL the child's process group (it has its own: ``start_new_session``), so what
    it started dies with it, and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(5)


@dataclass
class Children:
    """The processes one test starts (the ``children`` fixture). Each runs in a process group
    of its own; when the test ends, passed or failed, whatever is left of each group (and of
    any group named with ``group``) is SIGKILLed, the process reaped and its pipes closed.
    A test still stops its children itself where how they stop is what it checks."""

    started: list[subprocess.Popen[Any]] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)

    def popen(self, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        process: subprocess.Popen[Any] = subprocess.Popen(args, start_new_session=True, **kwargs)
        self.started.append(process)
        return process

    def server(self, server: ServerProcess) -> ServerProcess:
        """A server started by ``start_server``/``start_gateway``, killed at the end if alive."""
        self.started.append(server.process)
        return server

    def group(self, pgid: int) -> None:
        """A process group a child left behind (a command it ran in a group of its own)."""
        self.groups.append(pgid)

    def kill_all(self) -> None:
        for pgid in self.groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        for process in reversed(self.started):
            kill_group(process)
            for stream in (process.stdin, process.stdout, process.stderr):
                if stream is not None:
                    stream.close()


def agents_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "cleveragents.acp.client.cli.main", *args]


def run_agents(
    args: Sequence[str], directory: pathlib.Path, *, env: dict[str, str] | None = None, name: str = "server"
) -> subprocess.Popen[bytes]:
    stderr = open(directory / f"{name}.stderr", "w")  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            agents_command(*args),
            stdout=subprocess.PIPE,
            stderr=stderr,
            env={**os.environ, **(env or {})},
            cwd=directory,
            start_new_session=True,
        )
    finally:
        stderr.close()


def _fail(process: subprocess.Popen[bytes], message: str) -> AssertionError:
    kill_group(process)
    if process.stdout is not None:
        process.stdout.close()
    return AssertionError(message)


def wait_ready(process: subprocess.Popen[bytes], stderr_path: pathlib.Path) -> ServerProcess:
    """Read stdout until the ``acp-ready`` line, within START_TIMEOUT (unbuffered reads, so
    the selector never waits on lines already read)."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    buffer = b""
    lines: list[str] = []
    deadline = time.monotonic() + START_TIMEOUT
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _fail(process, f"no acp-ready line: {lines} {stderr_path.read_text()}")
            if not selector.select(remaining):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise _fail(process, f"server exited: {lines} {stderr_path.read_text()}")
            buffer += chunk
            *complete, buffer = buffer.split(b"\n")
            for raw in complete:
                line = raw.decode()
                lines.append(line)
                if line.startswith("acp-ready "):
                    ready = json.loads(line.removeprefix("acp-ready "))
                    _drain(fd, buffer, lines)
                    return ServerProcess(process, ready["http"], ready["grpc"], lines, stderr_path)


# Lines of a server's stdout (its access log) kept for a test to read; the rest are dropped.
MAX_KEPT_LINES = 100_000


def _drain(fd: int, buffer: bytes, lines: list[str]) -> None:
    """Keep reading the server's stdout after its ready line (its access log goes there), so
    a full pipe never holds up its log writer."""

    def read() -> None:
        rest = buffer
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                return
            if not chunk:
                return
            rest += chunk
            *complete, rest = rest.split(b"\n")
            if len(lines) < MAX_KEPT_LINES:
                lines.extend(raw.decode(errors="replace") for raw in complete)

    threading.Thread(target=read, daemon=True, name="server-stdout").start()


def start_server(
    directory: pathlib.Path,
    *extra: str,
    tokens: pathlib.Path | None = None,
    env: dict[str, str] | None = None,
    name: str = "server",
    roots: Sequence[pathlib.Path] | None = None,
) -> ServerProcess:
    args = ["serve", "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0"]
    args += ["--db", str(directory / f"{name}.db"), "--sse-keepalive", "0.3", "--grace-seconds", "3"]
    if tokens is not None:
        args += ["--tokens", str(tokens)]
    if roots is None:
        # The test session's temp folder: tests keep their projects beside the server's.
        roots = [directory.parent]
    for root in roots:
        args += ["--resource-root", str(root)]
    process = run_agents([*args, *extra], directory, env=env, name=name)
    return wait_ready(process, directory / f"{name}.stderr")


def start_gateway(
    directory: pathlib.Path,
    upstream: str,
    *extra: str,
    name: str = "gateway",
    env: dict[str, str] | None = None,
) -> ServerProcess:
    args = ["gateway", "--upstream", upstream, "--host", "127.0.0.1", "--http-port", "0"]
    args += ["--sse-keepalive", "0.3", "--grace-seconds", "3"]
    process = run_agents([*args, *extra], directory, env=env, name=name)
    return wait_ready(process, directory / f"{name}.stderr")
