"""``codec_fast`` uses json_format's private API (``_Printer``, ``_FieldToJsonObject``,
``_UNPAIRED_SURROGATE_PATTERN``), so pyproject.toml pins protobuf to one major. This runs
tests/contract/test_codec_fast.py against the newest protobuf release the pin allows,
which ``make test``'s set-up installs from the package index into .build/newest-protobuf
(``make newest-protobuf``), put ahead of this environment's site-packages, so a release that
changes the private API fails here before it reaches users. Nothing is downloaded during the
test; without that folder it skips, saying so loudly, and fails under CI=true (tests/needs.py).
"""

from __future__ import annotations

import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys
import tomllib

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests import needs

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent
DEPENDENCIES: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
PIN = next(d for d in DEPENDENCIES if re.match(r"protobuf\s*[<>=!~]", d))


def test_protobuf_is_pinned_to_one_major() -> None:
    assert re.fullmatch(r"protobuf>=(\d+)\.\d+(\.\d+)?,<(\d+)", PIN), PIN
    low, high = re.findall(r"[<>]=?(\d+)", PIN)
    assert int(high) == int(low) + 1, PIN


@pytest.mark.timeout(600)
def test_codec_fast_against_the_newest_protobuf_of_the_pinned_major() -> None:
    reason = needs.missing_newest_protobuf()
    if reason is not None:
        needs.unavailable(f"codec_fast was NOT checked against the newest protobuf: {reason}")
    site = needs.NEWEST_PROTOBUF
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
    # What `make test` installed is within the pin and no older than this environment's.
    assert Version(version) in SpecifierSet(PIN.removeprefix("protobuf")), (version, PIN)
    assert Version(version) >= Version(importlib.metadata.version("protobuf")), version
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
