"""Issue 17 "What to build" 3: a command runs without the server's secrets, under
resource limits, in its own process group (killed whole), and as the operator's
unprivileged user when the server runs as root."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import pwd
import resource
import signal
import subprocess
import time

import pytest

from cleveragents.acp.facade.domain.access.policy import CommandUser, Policy, ProcessLimits
from cleveragents.acp.facade.domain.plans import process
from tests.facade.plans.helpers import PY, gone
from tests.facade.plans.plan_child import FAMILY

REPO = pathlib.Path(__file__).resolve().parents[2]
# A server's part in a command: process.run in a process of its own (argv: folder, command...).
SERVER = (
    "import asyncio, pathlib, sys\n"
    "from cleveragents.acp.facade.domain.plans import process\n"
    "from cleveragents.acp.facade.domain.access.policy import Policy\n"
    "asyncio.run(process.run(sys.argv[2:], pathlib.Path(sys.argv[1]), seconds=600, output_limit=1024,\n"
    "                        cancel=asyncio.Event(), policy=Policy()))\n"
)
LIMITS = ProcessLimits(cpu_seconds=30, memory_bytes=2 * 1024**3, file_bytes=1024**2, processes=4096)


async def _run(
    argv: list[str], cwd: pathlib.Path, policy: Policy, seconds: float = 30
) -> process.ProcessResult:
    return await process.run(
        argv, cwd, seconds=seconds, output_limit=65536, cancel=asyncio.Event(), policy=policy
    )


async def test_the_environment_is_an_allow_list(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-value")
    monkeypatch.setenv("ACP_DB", "postgresql://user:pw@db/acp")
    result = await _run(
        [PY, "-c", "import json, os; print(json.dumps(dict(os.environ)))"], tmp_path, Policy()
    )
    seen = json.loads(result.stdout)
    assert "sk-secret-value" not in result.stdout
    assert "OPENAI_API_KEY" not in seen
    assert "ACP_DB" not in seen
    assert set(seen) <= {*process.ENV_ALLOWED, "LC_CTYPE"}
    assert "PATH" in seen


async def test_resource_limits_apply_and_cannot_be_raised(tmp_path: pathlib.Path) -> None:
    script = (
        "import json, resource; names = ['RLIMIT_CPU', 'RLIMIT_AS', 'RLIMIT_FSIZE', 'RLIMIT_NPROC'];"
        "print(json.dumps({n: resource.getrlimit(getattr(resource, n)) for n in names}))"
    )
    result = await _run([PY, "-c", script], tmp_path, Policy(limits=LIMITS))
    seen = json.loads(result.stdout)
    expected = {
        "RLIMIT_CPU": LIMITS.cpu_seconds,
        "RLIMIT_AS": LIMITS.memory_bytes,
        "RLIMIT_FSIZE": LIMITS.file_bytes,
        "RLIMIT_NPROC": LIMITS.processes,
    }
    for name, value in expected.items():
        hard = resource.getrlimit(getattr(resource, name))[1]
        cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
        assert seen[name] == [cap, cap], name
    big = await _run(
        [PY, "-c", "open('big', 'wb').write(b'x' * (2 * 1024 * 1024))"], tmp_path, Policy(limits=LIMITS)
    )
    assert not big.ok
    assert (tmp_path / "big").stat().st_size <= LIMITS.file_bytes


async def test_a_timeout_kills_the_whole_process_group(tmp_path: pathlib.Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = (
        "import subprocess, sys, time; child = subprocess.Popen(['sleep', '60']);"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(60)"
    )
    result = await _run([PY, "-c", script], tmp_path, Policy(), seconds=2)
    assert result.timed_out
    child = int(pid_file.read_text())
    for _ in range(200):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError(f"the command's child {child} outlived the timeout")


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
async def test_as_root_commands_run_as_the_command_user(tmp_path: pathlib.Path) -> None:
    account = pwd.getpwnam("nobody")
    scratch = tmp_path / "scratch"
    scratch.mkdir(mode=0o700)
    (scratch / "given.txt").write_text("staged\n")
    user = CommandUser("nobody", account.pw_uid, account.pw_gid)
    script = "import os; open('made.txt', 'w').write(f'{os.getuid()} {os.getgid()} {os.getgroups()}')"
    result = await _run(["python3", "-c", script], scratch, Policy(command_user=user))
    assert result.ok, result.stderr
    assert (scratch / "made.txt").read_text() == f"{account.pw_uid} {account.pw_gid} []"
    # The server's own files stay out of reach.
    denied = await _run(["cat", "/etc/shadow"], scratch, Policy(command_user=user))
    assert not denied.ok


async def test_a_command_that_cannot_start_is_an_os_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        await _run(["no-such-program-acp"], tmp_path, Policy(limits=LIMITS))
    assert info.value.filename == "no-such-program-acp"
    assert info.value.strerror


async def test_a_command_inherits_only_its_standard_streams(tmp_path: pathlib.Path) -> None:
    """The wrapper's report pipe closes at the exec; the server's files never reach it."""
    result = await _run(
        [PY, "-c", "import os; print(sorted(map(int, os.listdir('/proc/self/fd'))))"], tmp_path, Policy()
    )
    assert result.ok, result.stderr
    # 0-2, and the folder listdir opened to read the list.
    assert json.loads(result.stdout)[:3] == [0, 1, 2]
    assert len(json.loads(result.stdout)) == 4, result.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")
async def test_a_program_the_command_user_cannot_run_is_an_os_error(tmp_path: pathlib.Path) -> None:
    account = pwd.getpwnam("nobody")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    program = private / "tool"
    program.write_text("#!/bin/sh\nexit 0\n")
    program.chmod(0o700)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    user = CommandUser("nobody", account.pw_uid, account.pw_gid)
    with pytest.raises(PermissionError):
        await _run([str(program)], scratch, Policy(command_user=user))


def test_a_command_dies_with_the_server_that_started_it(tmp_path: pathlib.Path) -> None:
    """Issue 30 item 5: the server is killed with SIGKILL (it can clean nothing up) while a
    command runs in its own session; the command's whole group goes with it."""
    pids = tmp_path / "pids"
    server = subprocess.Popen(
        [PY, "-c", SERVER, str(tmp_path), PY, "-c", FAMILY, str(pids)], cwd=REPO, start_new_session=True
    )
    family: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while not pids.exists():
            assert server.poll() is None, "the server ended before the command ran"
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.02)
        family = [int(pid) for pid in pids.read_text().split()]
        assert not any(map(gone, family))
        server.send_signal(signal.SIGKILL)
        server.wait(30)
        deadline = time.monotonic() + 30
        while not all(map(gone, family)):
            assert time.monotonic() < deadline, f"the command's group {family} outlived the server"
            time.sleep(0.02)
    finally:
        server.kill()
        server.wait(30)
        for pid in family:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
