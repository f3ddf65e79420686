"""``codec_fast`` uses json_format's private API (``_Printer``, ``_FieldToJsonObject``,
``_UNPAIRED_SURROGATE_PATTERN``), so pyproject.toml pins protobuf to one major. This runs
tests/contract/test_codec_fast.py against the newest protobuf release the pin allows,
installed from the package index into a scratch directory put ahead of this environment's
site-packages, so a release that changes the private API fails here before it reaches users.

Without the index (no network, no mirror) it skips, saying so: network never fails CI.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
DEPENDENCIES: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
PIN = next(d for d in DEPENDENCIES if re.match(r"protobuf\s*[<>=!~]", d))


def test_protobuf_is_pinned_to_one_major() -> None:
    assert re.fullmatch(r"protobuf>=(\d+)\.\d+(\.\d+)?,<(\d+)", PIN), PIN
    low, high = re.findall(r"[<>]=?(\d+)", PIN)
    assert int(high) == int(low) + 1, PIN


@pytest.mark.timeout(600)
def test_codec_fast_against_the_newest_protobuf_of_the_pinned_major(tmp_path: pathlib.Path) -> None:
    site = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary",
            ":all:",
            "--timeout",
            "20",
            "--retries",
            "1",
            "--target",
            str(site),
            PIN,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if install.returncode != 0:
        pytest.skip(
            f"!!! could not install {PIN!r} from the package index, so codec_fast was NOT checked "
            f"against the newest protobuf: {install.stderr.strip()[-400:]}"
        )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    where = subprocess.run(
        [sys.executable, "-c", "import google.protobuf as p; print(p.__version__); print(p.__file__)"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    version, location = where.stdout.split()
    assert pathlib.Path(location).is_relative_to(site), where.stdout
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            "tests/contract/test_codec_fast.py",
        ],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
        env=env,
        cwd=ROOT,
    )
    assert run.returncode == 0, (
        f"codec_fast fails on protobuf {version}:\n{run.stdout[-3000:]}{run.stderr[-2000:]}"
    )
