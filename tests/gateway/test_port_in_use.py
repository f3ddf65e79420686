"""A port in use stops ``agents serve`` with one line of ours, for HTTP and gRPC alike: no
gRPC C-core log line before it (issue 18, item 4)."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess

import pytest

from tests.server_process import Tokens, agents_command


@pytest.mark.parametrize("which", ["--grpc-port", "--http-port"])
def test_a_port_in_use_is_one_clear_line(tmp_path: pathlib.Path, which: str) -> None:
    tokens = Tokens.create(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        ports = {"--grpc-port": "0", "--http-port": "0", which: port}
        args = [
            "serve",
            "--host",
            "127.0.0.1",
            "--db",
            str(tmp_path / "acp.db"),
            "--tokens",
            str(tokens.path),
        ]
        for flag, value in ports.items():
            args += [flag, value]
        done = subprocess.run(
            agents_command(*args),
            capture_output=True,
            text=True,
            timeout=60,
            env={k: v for k, v in os.environ.items() if not k.startswith("ACP_")},
        )
    assert done.returncode == 2, done
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("agents serve: cannot listen for "), lines
    assert f":{port}" in lines[0]
    assert "add_port" not in done.stderr
