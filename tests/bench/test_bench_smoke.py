"""The benchmark runs end to end in its smoke mode, so its code cannot rot unnoticed.

Timings are never asserted: only that every figure is there, as a number."""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys

import pytest

from bench import report

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _bench(out: pathlib.Path, *args: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--smoke", "--out", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        # Every family, ``layers`` starting two gateway processes of its own: about 150 s
        # on a 2-core machine other suites share (load average 10), a third of that alone.
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    doc: dict[str, object] = json.loads(out.read_text())
    return doc


@pytest.mark.timeout(270)
def test_smoke_run_reports_every_figure(tmp_path: pathlib.Path) -> None:
    doc = _bench(tmp_path / "results.json")
    figures = doc["figures"]
    assert isinstance(figures, dict)
    assert set(report.FIGURES) <= set(figures)
    for name in report.FIGURES:
        value = figures[name]
        assert isinstance(value, int | float), name
        assert math.isfinite(value), name
        assert value > 0, name
    assert doc["mode"] == "smoke"
    for key in ("machine", "versions", "date", "measured_by", "goals"):
        assert doc[key], key


@pytest.mark.timeout(120)
def test_python_load_generators_measure_without_wrk_or_h2load(tmp_path: pathlib.Path) -> None:
    doc = _bench(tmp_path / "results.json", "--only", "unary", "--load", "python")
    measured_by = doc["measured_by"]
    assert isinstance(measured_by, dict)
    assert measured_by["grpc_unary_ratio"] == "python-grpc"
    assert measured_by["gateway_envelope_ratio"] == "python-http"
    figures = doc["figures"]
    assert isinstance(figures, dict)
    assert figures["grpc_unary_ratio"] > 0
    # One session shown over and over, nothing committed meanwhile: from memory.
    details = doc["details"]
    assert isinstance(details, dict)
    assert details["unary_read_cache_hit_fraction"] > 0.9
