"""The ``peer`` family (bench/peer.py) never drops its figures quietly: without the peer's
virtualenv (``make bench-peer``) it says so loudly and records nothing, and under ``CI=true``
the benchmark fails. The smoke run leaves the family out (it needs software the project does
not install), so these need no peer: they point the family at a virtualenv that is not there."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from bench import __main__ as bench_main

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _peer_family(tmp_path: pathlib.Path, ci: str) -> tuple[subprocess.CompletedProcess[str], pathlib.Path]:
    out = tmp_path / "results.json"
    env = {**os.environ, "ACP_BENCH_PEER": str(tmp_path / "no-peer-venv"), "CI": ci}
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--only", "peer", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return done, out


def test_without_its_venv_the_peer_family_fails_the_run_under_ci(tmp_path: pathlib.Path) -> None:
    done, out = _peer_family(tmp_path, "true")
    assert done.returncode != 0
    assert "!!! bench: peer NOT MEASURED" in done.stderr
    assert "make bench-peer" in done.stderr
    assert not out.exists()


def test_without_its_venv_the_peer_family_says_so_and_records_nothing(tmp_path: pathlib.Path) -> None:
    done, out = _peer_family(tmp_path, "false")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "!!! bench: peer NOT MEASURED" in done.stderr
    doc = json.loads(out.read_text())
    assert "grpc_vs_peer_ratio" not in doc["figures"]
    assert "http_vs_peer_ratio" not in doc["figures"]
    assert "no-peer-venv" in doc["details"]["peer_skipped"]


def test_the_smoke_run_needs_no_peer() -> None:
    assert "peer" in bench_main.FAMILIES
    assert "peer" in bench_main.NOT_IN_SMOKE
