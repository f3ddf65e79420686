"""The build itself: gen/ drift detection and the installed package's shape."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def _copy_for_make(tmp: pathlib.Path) -> pathlib.Path:
    work = tmp / "repo"
    work.mkdir()
    for name in ("proto", "gen", "Makefile", "pyproject.toml"):
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, work / name)
    return work


def _gen_check(work: pathlib.Path) -> subprocess.CompletedProcess[str]:
    venv = pathlib.Path(sys.executable).parent.parent
    # The copied pyproject keeps its mtime, so make sees the venv as up to date.
    return subprocess.run(
        ["make", "-s", "gen-check", f"VENV={venv}", f"STAMP={venv}/.installed-stamp"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PATH": f"{venv}/bin:{os.environ['PATH']}"},
    )


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_gen_check_passes_in_step_and_fails_after_an_unregenerated_edit(tmp_path: pathlib.Path) -> None:
    work = _copy_for_make(tmp_path)
    clean = _gen_check(work)
    assert clean.returncode == 0, clean.stdout + clean.stderr
    proto = work / "proto/cleveragents/acp/v1/meta.proto"
    proto.write_text(
        proto.read_text().replace("string server_build = 3;", "string server_build = 3;\n  string x = 4;")
    )
    drifted = _gen_check(work)
    assert drifted.returncode != 0
    assert "run 'make gen'" in drifted.stdout


def test_generated_package_imports_under_one_namespace() -> None:
    import cleveragents.acp.facade
    import cleveragents.acp.v1.plan_pb2 as plan_pb2

    assert plan_pb2.DESCRIPTOR.package == "cleveragents.acp.v1"
    assert pathlib.Path(cleveragents.acp.facade.__file__).parent == ROOT / "facade"
