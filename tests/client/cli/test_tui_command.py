"""``agents tui`` as a real process: in the command overview, its connection checked like every
command's, and run on a real terminal (a pty) in local mode until ``q`` ends it."""

from __future__ import annotations

import os
import pty
import select
import time

from tests.client.cli.conftest import CLI_TIMEOUT, Cli
from tests.server_process import Children, agents_command


def test_listed_and_its_connection_checked(local_cli: Cli) -> None:
    assert "tui" in local_cli("--help").out
    refused = local_cli("tui", "--token", "acp_x", expect=2)
    assert "a token is for a server" in refused.err


def read_until(fd: int, wanted: bytes, seconds: float) -> bytes:
    """What the terminal shows until ``wanted`` is among it (bounded)."""
    seen = b""
    deadline = time.monotonic() + seconds
    while wanted not in seen:
        left = deadline - time.monotonic()
        assert left > 0, seen[-2000:]
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
    return seen


def test_runs_on_a_terminal_and_q_quits(local_cli: Cli, children: Children) -> None:
    local_cli("session", "create", "--title", "on-a-terminal")
    primary, secondary = pty.openpty()
    try:
        process = children.popen(
            agents_command("tui"),
            env={**local_cli.env, "TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"},
            stdin=secondary,
            stdout=secondary,
            # Textual draws on stderr.
            stderr=secondary,
            cwd=local_cli.cwd,
        )
        os.close(secondary)
        shown = read_until(primary, b"on-a-terminal", CLI_TIMEOUT)
        os.write(primary, b"q")
        process.wait(timeout=CLI_TIMEOUT)
    finally:
        os.close(primary)
    assert process.returncode == 0
    assert b"Traceback" not in shown
