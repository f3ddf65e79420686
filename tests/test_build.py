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
    # Quiet when in step: one line, nothing on stderr (the generator's chatter is kept back).
    assert (clean.stdout, clean.stderr) == ("gen/ is up to date\n", "")
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


def test_a_built_wheel_carries_every_package_and_imports(tmp_path: pathlib.Path) -> None:
    """The wheel, not just the editable install, must hold the package-dir mapped layers."""
    import zipfile

    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            ".",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    # setuptools warned three times that a folder of the console's files was "absent from the
    # `packages` configuration" and would one day be left out (issue 29).
    assert "Warning" not in built.stderr, built.stderr
    (wheel,) = tmp_path.glob("cleveragents_acp-*.whl")
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(unpacked)
    for module in (
        "v1/plan_pb2.py",
        "v1/plan_pb2.pyi",
        "contract/catalog.py",
        "facade/factory.py",
        "gateway/server.py",
        "client/cli/main.py",
        "gateway/web/static/console/index.html",
        "gateway/web/static/console/views/plans.js",
        "gateway/web/static/console/console.css",
        "gateway/web/static/console/icon.svg",
        "gateway/web/static/docs/init.js",
    ):
        assert f"cleveragents/acp/{module}" in names
    # The test-only ACP 2 (tests/proto_v2) ships in no form.
    assert not [name for name in names if name.endswith(".proto") or "acp/v2/" in name]
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import cleveragents.acp.facade.factory, cleveragents.acp.gateway.server; "
        "import cleveragents.acp.client.cli.main; "
        "from cleveragents.acp.contract import catalog; "
        "assert list(catalog.CATALOG.majors) == [1], catalog.CATALOG.majors; "
        "stray = [n for n, m in sys.modules.items() if n.startswith('cleveragents.acp.') "
        "and getattr(m, '__file__', None) and not m.__file__.startswith(sys.argv[1])]; "
        "assert not stray, stray"
    )
    imported = subprocess.run(
        [sys.executable, "-c", probe, str(unpacked)], capture_output=True, text=True, timeout=120
    )
    assert imported.returncode == 0, imported.stderr
