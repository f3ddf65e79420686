"""``/readyz`` while the store migrates (issue 15): a real ``agents serve`` over a new
database file whose write lock another process holds, so its first migration waits. The
server already listens meanwhile: ``/readyz`` answers 503 ``migrating`` and a call is refused
NOT_READY; once the lock goes, the migration runs, ``/readyz`` turns ready and the server
prints its ready line and answers calls."""

from __future__ import annotations

import pathlib
import socket
import sqlite3
import subprocess
import sys
import time

import httpx

from cleveragents.acp.facade import auth
from tests.server_process import kill_group, run_agents, wait_ready

WAIT = 60.0

# Makes the file a database in WAL mode at schema version 0, holds its write lock until a
# line comes on stdin, then lets go.
LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=WAL")
db.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
db.close()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ready_state(url: str) -> tuple[int, str] | None:
    """(status, what /readyz says), or None while nothing listens."""
    try:
        answer = httpx.get(f"{url}/readyz", timeout=5)
    except httpx.TransportError:
        return None
    body = answer.json()
    if answer.status_code == 200:
        return 200, body["data"]["status"]
    return answer.status_code, body["error"]["details"]["status"]


def until(check: object, seconds: float = WAIT) -> object:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = check()  # type: ignore[operator]
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not within {seconds} s")


def test_readyz_says_migrating_until_the_store_is_migrated(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "acp.db"
    tokens = tmp_path / "tokens.toml"
    token = auth.create_token(tokens, "alice", ["default"])
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    server = None
    try:
        assert locker.stdout is not None
        assert locker.stdin is not None
        assert locker.stdout.readline().strip() == "locked"
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        args = ["serve", "--host", "127.0.0.1", "--http-port", str(port), "--grpc-port", "0"]
        args += ["--db", str(db), "--tokens", str(tokens), "--resource-root", str(tmp_path)]
        server = run_agents(args, tmp_path, env={"ACP_STORE_WRITE_TIMEOUT_SECONDS": "120"})
        # Listening, and not ready: the first migration waits for the lock. On a busy machine
        # /readyz may answer "starting" before the migration begins: that is passed over.
        assert until(
            lambda: (state := ready_state(url)) is not None and state != (503, "starting") and state
        ) == (
            503,
            "migrating",
        )
        refused = httpx.post(
            f"{url}/api/v1/acp",
            json={"operation": "session.list", "params": {}},
            headers={"Authorization": f"Bearer {token}"},
            timeout=5,
        )
        error = refused.json()["error"]
        assert (error["code"], error["details"]["refinement"]) == ("INVALID_STATE", "NOT_READY")
        with sqlite3.connect(db) as look:
            assert look.execute("PRAGMA user_version").fetchone()[0] == 0
        assert ready_state(url) == (503, "migrating")

        locker.stdin.write("go\n")
        locker.stdin.flush()
        assert locker.wait(WAIT) == 0
        assert until(lambda: ready_state(url) == (200, "ready"))
        running = wait_ready(server, tmp_path / "server.stderr")
        listed = httpx.post(
            f"{running.http}/api/v1/acp",
            json={"operation": "session.list", "params": {}},
            headers={"Authorization": f"Bearer {token}"},
            timeout=5,
        )
        assert listed.status_code == 200, listed.text
        with sqlite3.connect(db) as look:
            assert look.execute("PRAGMA user_version").fetchone()[0] > 0
        assert running.stop() == 0
        server = None
    finally:
        if locker.poll() is None:
            locker.kill()
            locker.wait(10)
        for pipe in (locker.stdin, locker.stdout):
            if pipe is not None:
                pipe.close()
        if server is not None:
            kill_group(server)
            if server.stdout is not None:
                server.stdout.close()
