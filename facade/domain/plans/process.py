"""Running a command for a plan, contained: argv only (no shell), in a scratch copy of
the staged files as its working folder, with a timeout, a cap on kept output, and
interruption when the plan is cancelled.

Containment (docs/security.md says what it does not cover):
- environment: an allow-list (``ENV_ALLOWED``), so no secret of the server's environment
  (model keys, database URLs) reaches the command;
- resource limits: CPU seconds, address space, file size, process count (``Policy.limits``);
- its own session and process group, killed as a whole on timeout or cancel, and by its
  supervisor (``CONTAIN``) when the server dies: a command never outlives the server process
  that started it, so a plan taken over after a crash has no command of the dead one's left
  making side effects (a lost lease cancels the step, which kills the group too);
- when the server runs as root, the operator's unprivileged ``--command-user`` (uid, gid,
  no supplementary groups), owning the scratch folder.

The user switch and the limits are made by a small supervisor (``CONTAIN``: this interpreter,
isolated, no site) that forks and execs the command; subprocess only starts it in a new session.
A ``preexec_fn`` or subprocess's ``user``/``group`` arguments would make CPython start the
child with ``fork()``, which runs gRPC's fork handlers in the child of a server whose gRPC
threads are busy, and the child then died of SIGABRT or SIGSEGV before its exec; without
them CPython uses ``vfork()``, which runs no fork handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import signal
import stat
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass

from cleveragents.acp.facade.domain.access.policy import CommandUser, Policy, ProcessLimits
from cleveragents.acp.facade.domain.plans.paths import ResourceRoot
from cleveragents.acp.facade.domain.plans.staging import Staging

DEFAULT_TIMEOUT_SECONDS = 30
DEFAULT_OUTPUT_LIMIT = 65536
# How long output pipes may stay open after the process group is gone.
_DRAIN_SECONDS = 2.0
# How long a cancel or timeout waits for the killed command to be reaped (by init: it is
# the supervisor's child) before answering anyway.
_GONE_SECONDS = 2.0
# The only variables of the server's environment a command sees.
ENV_ALLOWED = ("PATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ", "TERM")
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def environment(source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The command's environment: the allow-listed variables, a default PATH."""
    source = os.environ if source is None else source
    env = {name: source[name] for name in ENV_ALLOWED if name in source}
    env.setdefault("PATH", _DEFAULT_PATH)
    return env


# Run as ``python -I -S -c CONTAIN REPORT WATCH CPU AS FSIZE NPROC UID GID ARGV...`` (UID -1:
# no switch), in a new session. It forks the command: the child drops to the command user,
# lowers soft and hard limits (so the command cannot raise them) and execs ARGV; an OSError
# is written to the REPORT pipe, which otherwise closes at the exec. What execvp imports is
# imported first: the command user may not be able to read this interpreter's library.
# The parent stays, as the server's user, the command's supervisor: it exits as the command
# does (its status passed on), and when the WATCH pipe reads end-of-file (the server closed
# it, or died: a kill -9 too) it kills the whole process group, the command's and its own.
CONTAIN = """\
import os, resource, select, signal, sys, warnings
report, watch, cpu, memory, size, count, uid, gid = map(int, sys.argv[1:9])
argv = sys.argv[9:]
limits = ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, memory),
          (resource.RLIMIT_FSIZE, size), (resource.RLIMIT_NPROC, count))
command = os.fork()
if command == 0:
    try:
        os.close(watch)
        if uid >= 0:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
        for which, value in limits:
            hard = resource.getrlimit(which)[1]
            cap = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (cap, cap))
        os.set_inheritable(report, False)
        os.execvp(argv[0], argv)
    except OSError as exc:
        os.write(report, f"{exc.errno or 0} {exc.strerror or exc}".encode())
    os._exit(127)
os.close(report)
done = os.pidfd_open(command)
while True:
    ready = select.select([done, watch], [], [])[0]
    if done in ready:
        status = os.waitpid(command, 0)[1]
        if os.WIFSIGNALED(status):
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
            os.kill(os.getpid(), os.WTERMSIG(status))
        os._exit(os.waitstatus_to_exitcode(status) & 0xFF)
    if not os.read(watch, 64):
        os.killpg(0, signal.SIGKILL)
"""


def contained(
    argv: list[str], report: int, watch: int, limits: ProcessLimits, user: CommandUser | None
) -> list[str]:
    """The supervisor's command line for ``argv`` (``CONTAIN``)."""
    sizes = (limits.cpu_seconds, limits.memory_bytes, limits.file_bytes, limits.processes)
    ids = (user.uid, user.gid) if user is not None else (-1, -1)
    return [
        sys.executable,
        "-I",
        "-S",
        "-c",
        CONTAIN,
        str(report),
        str(watch),
        *map(str, (*sizes, *ids)),
        *argv,
    ]


async def _exec_report(fd: int) -> bytes:
    """What the wrapper reported before its exec failed; empty once the command runs (the
    pipe closes at the exec) or the wrapper died. Closes ``fd``."""
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    os.set_blocking(fd, False)
    loop.add_reader(fd, readable.set)
    chunks: list[bytes] = []
    try:
        while True:
            await readable.wait()
            readable.clear()
            try:
                chunk = os.read(fd, 4096)
            except BlockingIOError:
                continue
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _start_error(report: bytes, program: str) -> OSError:
    errno_text, _, message = report.decode(errors="replace").partition(" ")
    code = int(errno_text) if errno_text.isdigit() else 0
    return OSError(code, message, program)


def hand_over(folder: pathlib.Path, user: CommandUser | None) -> None:
    """Give the scratch folder (and what was materialized in it) to the command user."""
    if user is None:
        return
    os.chown(folder, user.uid, user.gid)
    for parent, dirs, files in os.walk(folder, followlinks=False):
        for name in (*dirs, *files):
            os.chown(os.path.join(parent, name), user.uid, user.gid, follow_symlinks=False)


@dataclass(frozen=True)
class ProcessResult:
    exit_code: int | None
    stdout: str
    stderr: str
    truncated: bool
    timed_out: bool
    cancelled: bool

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.cancelled


async def _read_capped(stream: asyncio.StreamReader | None, limit: int) -> tuple[bytes, bool]:
    """Keep the first ``limit`` bytes and drain the rest, so the child never blocks."""
    if stream is None:
        return b"", False
    kept = bytearray()
    truncated = False
    while chunk := await stream.read(65536):
        room = limit - len(kept)
        if room > 0:
            kept.extend(chunk[:room])
        if len(chunk) > room:
            truncated = True
    return bytes(kept), truncated


def _kill_group(process: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


async def _group_gone(pgid: int) -> None:
    """Wait (bounded) until no process of the killed group is left, zombies included: the
    command is the supervisor's child, so once both are killed init reaps it, a moment after
    the supervisor is reaped here. A cancel or timeout answers only when the command is gone."""
    deadline = time.monotonic() + _GONE_SECONDS
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        await asyncio.sleep(0.005)


async def run(
    argv: list[str],
    cwd: pathlib.Path,
    *,
    seconds: float,
    output_limit: int,
    cancel: asyncio.Event,
    policy: Policy,
) -> ProcessResult:
    """Run ``argv`` contained (see the module); OSError when it cannot start (no such
    program, or the operator's command user cannot run it)."""
    user = policy.command_user
    await asyncio.to_thread(hand_over, cwd, user)
    report, report_end = os.pipe()
    # Held open (never inherited: os.pipe's ends close at any exec) while the command may
    # run; its end-of-file, at close or at this process's death, kills the command's group.
    watch_end, watch = os.pipe()
    try:
        process = await asyncio.create_subprocess_exec(
            *contained(argv, report_end, watch_end, policy.limits, user),
            cwd=str(cwd),
            env=environment(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            pass_fds=(report_end, watch_end),
        )
    except BaseException:
        os.close(report)
        os.close(watch)
        raise
    finally:
        os.close(report_end)
        os.close(watch_end)
    try:
        return await _supervised(process, report, argv[0], seconds, output_limit, cancel)
    finally:
        os.close(watch)


async def _supervised(
    process: asyncio.subprocess.Process,
    report: int,
    program: str,
    seconds: float,
    output_limit: int,
    cancel: asyncio.Event,
) -> ProcessResult:
    try:
        failure = await _exec_report(report)
    except BaseException:
        _kill_group(process)
        raise
    if failure:
        await process.wait()
        raise _start_error(failure, program)
    readers = [
        asyncio.ensure_future(_read_capped(process.stdout, output_limit)),
        asyncio.ensure_future(_read_capped(process.stderr, output_limit)),
    ]
    waiting = asyncio.ensure_future(process.wait())
    cancelled = asyncio.ensure_future(cancel.wait())
    timed_out = was_cancelled = False
    try:
        done, _ = await asyncio.wait(
            {waiting, cancelled}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED
        )
        if waiting not in done:
            was_cancelled = cancelled in done
            timed_out = not was_cancelled
            _kill_group(process)
            await waiting
        _kill_group(process)
        finished, _ = await asyncio.wait(readers, timeout=_DRAIN_SECONDS)
    finally:
        killed = timed_out or was_cancelled or process.returncode is None
        if process.returncode is None:
            _kill_group(process)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        cancelled.cancel()
        for reader in readers:
            reader.cancel()
        await asyncio.gather(waiting, cancelled, *readers, return_exceptions=True)
        if killed:
            await _group_gone(process.pid)
    (out, out_cut), (err, err_cut) = (r.result() if r in finished else (b"", True) for r in readers)
    return ProcessResult(
        exit_code=None if timed_out or was_cancelled else process.returncode,
        stdout=out.decode("utf-8", errors="replace"),
        stderr=err.decode("utf-8", errors="replace"),
        truncated=out_cut or err_cut,
        timed_out=timed_out,
        cancelled=was_cancelled,
    )


def materialize(staging: Staging, root: ResourceRoot, dest: pathlib.Path) -> dict[str, bytes]:
    """Write the staged view of one resource into ``dest``; returns what was written."""
    written: dict[str, bytes] = {}
    for path in staging.files(root):
        content = staging.read(root, path)
        if content is None:
            continue
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        written[path] = content
    return written


def scan(dest: pathlib.Path) -> dict[str, bytes]:
    """The regular files under ``dest`` (symlinks are not followed, not reported)."""
    found: dict[str, bytes] = {}
    for folder, _dirs, files in os.walk(dest, followlinks=False):
        for name in files:
            entry = pathlib.Path(folder) / name
            content = _read_regular(entry)
            if content is not None:
                found[entry.relative_to(dest).as_posix()] = content
    return found


def _read_regular(entry: pathlib.Path) -> bytes | None:
    """A regular file's bytes, opened without following a symlink and without blocking
    on a FIFO (a process that outlived its group may still swap names in the folder)."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return handle.read()


def differences(before: Mapping[str, bytes], after: Mapping[str, bytes]) -> dict[str, bytes | None]:
    """Path -> new content (None: removed) for every file that differs."""
    changed: dict[str, bytes | None] = {
        path: content for path, content in after.items() if before.get(path) != content
    }
    changed.update({path: None for path in before if path not in after})
    return {path: changed[path] for path in sorted(changed)}
