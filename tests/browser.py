"""Debian's Chromium, driven by Playwright, for the tests that need a real browser.

``make test`` installs chromium when it is missing and may (root with apt-get). Otherwise
the browser tests are skipped, and the run says so in one loud header line; under
``CI=true`` they fail instead of skipping. ``playwright install`` is never used: it
downloads browsers, which cannot be fetched here.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib

from tests import needs

CHROMIUM = pathlib.Path(os.environ.get("ACP_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
]


def missing() -> str | None:
    """Why the browser tests cannot run here, or None when they can."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (apt-get install chromium; `make test` does it as root)"
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (pip install -e '.[dev]')"
    return None


def header() -> str | None:
    reason = missing()
    return None if reason is None else needs.loud("BROWSER TESTS", reason)
