"""What keeps the suite deterministic and clean, whatever shell runs it (a pytest plugin,
loaded by ``tests/conftest.py``):

- SIGINT restored when the shell ignores it (some CI shells do): an ignored signal is
  inherited across ``exec``, so children would ignore the Ctrl-C that tests send them.
- ``ast.parse`` serialized on CPython before 3.13: the AST constructor's recursion counter is
  shared by every thread there (gh-106905), so two threads building ASTs at once (hypothesis
  reading a lambda's source while another formats a traceback) can fail with
  ``SystemError: AST constructor recursion depth mismatch``.
- Every process the run starts carries ``RUN_MARKER`` in its environment (children inherit
  it); at the end of the run any such process still alive is killed with its process group
  and the run fails, naming it.
"""

from __future__ import annotations

import ast
import functools
import os
import pathlib
import signal
import sys
import threading
import time
import uuid
from typing import Any

import pytest

RUN_MARKER = "CLEVERAGENTS_TEST_RUN"
# A stopped child may need a moment to be reaped after its fixture ended.
LEAK_GRACE_SECONDS = 5.0
_AST_FIXED = (3, 13)


def restore_sigint() -> None:
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def serialize_ast_parse() -> None:
    if sys.version_info >= _AST_FIXED or getattr(ast.parse, "serialized", False):
        return
    lock = threading.RLock()
    parse = ast.parse

    @functools.wraps(parse)
    def serialized(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return parse(*args, **kwargs)

    serialized.serialized = True  # type: ignore[attr-defined]
    ast.parse = serialized


def _marked(pid: int, marker: str) -> bool:
    try:
        environ = pathlib.Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"{RUN_MARKER}={marker}".encode() in environ.split(b"\0")


def _alive(pid: int) -> bool:
    """Running (a zombie is dead, waiting only for its parent to read its status)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _command(pid: int) -> str:
    try:
        raw = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)[:200]


def leftovers(marker: str) -> dict[int, str]:
    """The live processes of this run other than pytest itself: pid -> command line."""
    found: dict[int, str] = {}
    if not pathlib.Path("/proc/self/environ").exists():
        return found
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        if pid != os.getpid() and _marked(pid, marker) and _alive(pid):
            found[pid] = _command(pid)
    return found


def _kill(pids: dict[int, str]) -> None:
    """SIGKILL each, with its process group when that is its own (not pytest's)."""
    own = os.getpgrp()
    for pid in pids:
        try:
            group = os.getpgid(pid)
            if group != own:
                os.killpg(group, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue


def pytest_configure(config: pytest.Config) -> None:
    restore_sigint()
    serialize_ast_parse()
    # A fresh marker per run: a pytest started by a test marks only its own children.
    os.environ[RUN_MARKER] = uuid.uuid4().hex


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    marker = os.environ.get(RUN_MARKER)
    if not marker or hasattr(session.config, "workerinput"):
        return
    deadline = time.monotonic() + LEAK_GRACE_SECONDS
    left = leftovers(marker)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = leftovers(marker)
    if not left:
        return
    _kill(left)
    lines = "\n".join(f"  pid {pid}: {command}" for pid, command in sorted(left.items()))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    message = f"processes this test run started are still alive (killed now):\n{lines}"
    if reporter is not None:
        reporter.ensure_newline()
        reporter.write_line(message, red=True)
    else:
        sys.stderr.write(message + "\n")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
