"""Another process opening the server's SQLite file beside it (an ``sqlite3`` shell, a
backup, ``agents --db``, a restarted worker) never crashes it: ``agents serve --workers 2``
under load, as real processes, with a loop of plain ``sqlite3`` openers beside it and one
worker killed and started again.

What keeps it safe is each server process's shared lock on the ``-shm`` file: with it, an
opener knows it is not alone and leaves ``-shm`` as it is; without it (the read cache's
mapping once closed its descriptor, which on Linux drops every lock the process holds on
the file), the opener truncated ``-shm`` under the server's mappings and the server died
of SIGBUS within a second. Each process's lock is read from ``/proc/locks``."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import httpx
import pytest

from tests.facade.store.shm_locks import shm_read_lockers
from tests.gateway.test_sse import new_session, tell
from tests.gateway.test_workers import fresh, ready_info, restarted_worker, running
from tests.server_process import ServerProcess, Tokens, start_server

TIMEOUT = 60.0
OPENS = 300
OPENER = """
import sqlite3, sys
for _ in range(int(sys.argv[2])):
    db = sqlite3.connect(sys.argv[1], timeout=30)
    db.execute("SELECT count(*) FROM records").fetchone()
    db.close()
"""


def open_beside(database: pathlib.Path) -> None:
    """``OPENS`` plain sqlite3 connections to the file, one after another, each reading."""
    subprocess.run([sys.executable, "-c", OPENER, str(database), str(OPENS)], check=True, timeout=TIMEOUT * 2)


class Load:
    """Clients reading and writing one session (each keeps a connection the kernel gave to
    either worker) until stopped; the calls that failed are kept, by the test's phase."""

    def __init__(self, server: ServerProcess, token: str, clients: int = 3) -> None:
        self.calls = 0
        self.phase = "openers"
        self.errors: dict[str, list[str]] = {}
        self._stop = threading.Event()
        with fresh(server) as client:
            self.session = new_session(client, token)
        self._threads = [
            threading.Thread(target=self._run, args=(server, token), daemon=True) for _ in range(clients)
        ]

    def _run(self, server: ServerProcess, token: str) -> None:
        with httpx.Client(base_url=server.http, timeout=30) as client:
            while not self._stop.is_set():
                try:
                    shown = client.post(
                        "/api/v1/acp",
                        json={"operation": "session.show", "params": {"session_id": self.session}},
                        headers={"Authorization": f"Bearer {token}"},
                    )
                    assert shown.status_code == 200, shown.text
                    if self.calls % 10 == 0:
                        tell(client, token, self.session, "beside")
                    self.calls += 1
                except (AssertionError, httpx.HTTPError) as exc:
                    self.errors.setdefault(self.phase, []).append(repr(exc))

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(TIMEOUT)


@pytest.fixture
def tokens(tmp_path: pathlib.Path) -> Tokens:
    return Tokens.create(tmp_path)


@pytest.fixture
def workers(tmp_path: pathlib.Path, tokens: Tokens) -> Iterator[ServerProcess]:
    server = start_server(tmp_path, "--workers", "2", tokens=tokens.path)
    with running(server):
        yield server


def test_openers_beside_a_loaded_server_and_a_worker_restart_crash_nothing(
    workers: ServerProcess, tokens: Tokens, tmp_path: pathlib.Path
) -> None:
    database = tmp_path / "server.db"
    first = ready_info(workers)["workers"]
    assert isinstance(first, list)
    pids = [int(pid) for pid in first]
    assert shm_read_lockers(database) >= set(pids)
    with Load(workers, tokens.tokens["alice"]) as load:
        open_beside(database)
        assert workers.process.poll() is None, workers.stderr()
        assert not load.errors, (load.errors, workers.stderr())
        load.phase = "restart"
        # No worker died (the parent would have started another and said so).
        assert not [line for line in list(workers.stdout) if line.startswith("acp-worker ")], workers.stderr()
        assert shm_read_lockers(database) >= set(pids)

        os.kill(pids[0], signal.SIGKILL)
        pids[0] = int(restarted_worker(workers)["pid"])
        open_beside(database)
    assert workers.process.poll() is None, workers.stderr()
    # Calls the killed worker held were cut (load.errors["restart"]); the other worker
    # lived on, through the new one's start and the openers: only one was started again.
    restarts = [line for line in list(workers.stdout) if line.startswith("acp-worker ")]
    assert len(restarts) == 1, (restarts, workers.stderr())
    assert shm_read_lockers(database) >= set(pids), workers.stderr()
    with fresh(workers) as client:
        for index in range(10):
            tell(client, tokens.tokens["alice"], load.session, f"after {index}")
    assert load.calls > 0
