"""What the fault-injection cases start and break: servers on fixed loopback ports (so a
restarted one is found where its clients look), a PostgreSQL cluster of the case's own, a
small tmpfs."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.server_process import ServerProcess, Tokens, kill_group, start_server

PG_BIN = pathlib.Path("/usr/lib/postgresql/15/bin")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Served:
    """One ``agents serve`` (possibly ``--workers``) that a case may kill and start again on
    the same ports and database."""

    directory: pathlib.Path
    tokens: Tokens
    db: str
    extra: tuple[str, ...] = ()
    http_port: int = 0
    grpc_port: int = 0
    process: ServerProcess | None = None

    def __post_init__(self) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def token(self) -> str:
        return self.tokens.tokens["alice"]

    def start(self, env: dict[str, str] | None = None) -> ServerProcess:
        if self.process is not None:
            self.kill()
        ports = ("--http-port", str(self.http_port), "--grpc-port", str(self.grpc_port))
        self.process = start_server(
            self.directory, "--db", self.db, *ports, *self.extra, tokens=self.tokens.path, env=env
        )
        return self.process

    def faults(self) -> str:
        """What the server logged of internal errors (for a failing case's message)."""
        if self.process is None:
            return ""
        lines = self.process.stdout + self.process.stderr().splitlines()
        return "\n".join(line for line in lines if "rror" in line)[-4000:]

    def kill(self) -> None:
        assert self.process is not None
        kill_group(self.process.process)
        if self.process.process.stdout is not None:
            self.process.process.stdout.close()

    def stop(self) -> int:
        assert self.process is not None
        return self.process.stop()


@dataclass
class OwnPostgres:
    """A PostgreSQL 15 cluster of the case's own on a free port (never the shared one on
    5432): initdb and pg_ctl as the ``postgres`` user (initdb refuses root), in a temp dir."""

    root: pathlib.Path
    port: int

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _pg(self, *args: str) -> None:
        command = [str(PG_BIN / args[0]), *args[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._pg(
            "pg_ctl",
            "-D",
            str(self.root / "data"),
            "-l",
            str(self.root / "log"),
            "-w",
            "-o",
            options,
            "start",
        )

    def stop(self) -> None:
        self._pg("pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "-w", "stop")

    def restart(self) -> None:
        self.stop()
        self.start()


@contextlib.contextmanager
def own_postgres() -> Iterator[OwnPostgres]:
    if not (PG_BIN / "initdb").exists():
        if os.environ.get("CI") == "true":
            raise AssertionError(f"{PG_BIN}/initdb is missing: the PostgreSQL fault cases cannot run")
        pytest.skip(f"{PG_BIN}/initdb is missing")
    root = pathlib.Path(tempfile.mkdtemp(prefix="acp-chaos-pg-"))
    try:
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        cluster = OwnPostgres(root, free_port())
        cluster._pg("initdb", "-D", str(root / "data"), "-A", "trust", "-U", "postgres", "--no-sync")
        cluster.start()
        try:
            yield cluster
        finally:
            with contextlib.suppress(subprocess.CalledProcessError):
                cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def small_tmpfs(size: str) -> Iterator[pathlib.Path]:
    """A tmpfs of ``size`` mounted for the case (root only; under CI=true a refusal fails)."""
    where = pathlib.Path(tempfile.mkdtemp(prefix="acp-chaos-tmpfs-"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    if done.returncode != 0:
        where.rmdir()
        why = done.stderr.decode(errors="replace").strip()
        if os.environ.get("CI") == "true":
            raise AssertionError(f"cannot mount a tmpfs for the disk-full case: {why}")
        pytest.skip(f"cannot mount a tmpfs (needs root): {why}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)
        with contextlib.suppress(OSError):
            where.rmdir()


def fill(path: pathlib.Path) -> None:
    """Write ``path`` until the file system has not a byte left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        size = 1 << 20
        while size >= 1:
            try:
                os.write(fd, b"\0" * size)
            except OSError:
                size //= 2
    finally:
        os.close(fd)
