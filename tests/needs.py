"""What some tests need from the machine, and the one rule for when it is missing.

PostgreSQL (tests/postgres.py), Debian's Chromium (tests/browser.py), the programs below and
the newest protobuf release of the pinned major are set up by ``make test`` when it can (as
root with apt-get; pip at set-up time, never during a test). A test whose need is missing
skips, and the run says so in one loud header line; under ``CI=true`` it fails instead, so
CI never passes green with a check left out.
"""

from __future__ import annotations

import os
import pathlib
import shutil
from typing import Any, NoReturn

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# Program -> what it checks (each is also its Debian package's name).
PROGRAMS = {
    "strace": "the fsync durability test",
    "curl": "the foreign-client tests",
    "openssl": "the TLS tests (their certificates)",
}
# Where `make test` installs the newest protobuf release of the pinned major (pip --target).
NEWEST_PROTOBUF = pathlib.Path(os.environ.get("ACP_NEWEST_PROTOBUF", ROOT / ".build" / "newest-protobuf"))


NOT_RUN = "!!! NOT RUN: "


def required() -> bool:
    """Under ``CI=true`` a missing need fails the tests that have it."""
    return os.environ.get("CI", "").lower() == "true"


def unavailable(reason: str) -> NoReturn:
    """Skip the calling test for ``reason`` (the run's summary repeats it, loudly); under
    ``CI=true`` fail it."""
    if required():
        pytest.fail(f"required under CI=true: {reason}")
    pytest.skip(f"{NOT_RUN}{reason}")


def summary(terminalreporter: Any) -> None:
    """Each reason tests were skipped for want of something, once, at the end of the run
    (where a quiet ``-q`` run, which shows no header, shows it)."""
    reasons: dict[str, None] = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = getattr(report, "longrepr", "")
        text = str(longrepr[2] if isinstance(longrepr, tuple) else longrepr)
        if NOT_RUN in text:
            reasons[text[text.index(NOT_RUN) :]] = None
    for reason in reasons:
        terminalreporter.write_line(reason, red=True, bold=True)


def loud(what: str, reason: str) -> str:
    """The run's header line for tests that cannot run here."""
    if required():
        return f"!!! {what} WILL FAIL (CI=true): {reason}"
    return f"!!! {what} SKIPPED: {reason}"


def missing_program(name: str) -> str | None:
    if shutil.which(name) is not None:
        return None
    return f"{name} is not installed (apt-get install {name}; `make test` does it as root)"


def program(name: str) -> str:
    """The path of ``name`` (one of ``PROGRAMS``), or the test skips (fails under CI=true)."""
    found = shutil.which(name)
    if found is None:
        unavailable(f"{PROGRAMS[name]} cannot run: {missing_program(name)}")
    return found


def missing_newest_protobuf() -> str | None:
    if (NEWEST_PROTOBUF / "google" / "protobuf").is_dir():
        return None
    return (
        f"no newest protobuf release in {NEWEST_PROTOBUF} (`make newest-protobuf` installs it "
        "from the package index; `make test` runs it)"
    )


def header() -> list[str]:
    lines = []
    for name, checks in PROGRAMS.items():
        reason = missing_program(name)
        if reason is not None:
            lines.append(loud(checks.upper(), reason))
    reason = missing_newest_protobuf()
    if reason is not None:
        lines.append(loud("THE NEWEST-PROTOBUF TEST", reason))
    return lines
