"""The suite's own hygiene (tests/hygiene.py): leftover processes are found by the run's
marker, SIGINT reaches children even when the shell ignores it, AST construction is one
thread at a time where CPython needs that."""

from __future__ import annotations

import ast
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from tests import hygiene
from tests.server_process import Children

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_a_process_of_the_run_left_alive_is_found_until_it_is_stopped() -> None:
    marker = "hygiene-test"
    child = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env={**os.environ, hygiene.RUN_MARKER: marker},
        start_new_session=True,
    )
    try:
        assert child.pid in hygiene.leftovers(marker)
        assert child.pid not in hygiene.leftovers("another-run")
    finally:
        child.kill()
        child.wait(10)
    assert child.pid not in hygiene.leftovers(marker)


def test_a_run_that_leaves_a_process_alive_fails_naming_it_and_kills_it(
    tmp_path: pathlib.Path, children: Children
) -> None:
    """The end-of-run check itself, on a pytest run of its own whose one test passes but
    leaves a process running."""
    pid_file = tmp_path / "leaked.pid"
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_leak.py").write_text(
        textwrap.dedent(
            f"""
            import subprocess, sys

            def test_passes_but_leaves_a_process() -> None:
                child = subprocess.Popen(
                    [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
                )
                open({str(pid_file)!r}, "w").write(str(child.pid))
            """
        )
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.hygiene", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    leaked = int(pid_file.read_text())
    children.group(leaked)
    assert "1 passed" in run.stdout, run.stdout
    assert run.returncode == pytest.ExitCode.TESTS_FAILED, run.stdout + run.stderr
    assert "processes this test run started are still alive" in run.stdout
    assert f"pid {leaked}: " in run.stdout
    assert not hygiene._alive(leaked)


def test_children_get_sigint_even_when_the_shell_ignored_it() -> None:
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        hygiene.restore_sigint()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        code = "import signal, sys; sys.exit(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
        assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0
    finally:
        signal.signal(signal.SIGINT, before)


def test_ast_construction_in_many_threads_never_fails() -> None:
    """gh-106905: on CPython before 3.13 the AST constructor's depth counter is shared by
    threads; ast.parse is serialized in the test process so that it cannot bite."""
    if sys.version_info < (3, 13):
        assert getattr(ast.parse, "serialized", False)
    source = "x = " + "[" * 40 + "]" * 40 + "\n" + "def f(a):\n    return (a, {1: [2, (3,)]})\n" * 20
    errors: list[BaseException] = []

    def parse_many() -> None:
        try:
            for _ in range(100):
                ast.parse(source)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=parse_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
