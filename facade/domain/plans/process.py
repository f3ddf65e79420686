"""Running a command for a plan: argv only (no shell), in a scratch folder, with a
timeout, a cap on kept output, and interruption when the plan is cancelled.

The command runs in its own process group, so a timeout or a cancel kills everything it
started, not only the first process.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import signal
from collections.abc import Mapping
from dataclasses import dataclass

from cleveragents.acp.facade.domain.plans.paths import ResourceRoot
from cleveragents.acp.facade.domain.plans.staging import Staging

DEFAULT_TIMEOUT_SECONDS = 30
DEFAULT_OUTPUT_LIMIT = 65536
# How long output pipes may stay open after the process group is gone.
_DRAIN_SECONDS = 2.0


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


async def run(
    argv: list[str],
    cwd: pathlib.Path,
    *,
    seconds: float,
    output_limit: int,
    cancel: asyncio.Event,
) -> ProcessResult:
    """Run ``argv``; OSError when it cannot start (no such program)."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=str(cwd),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
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
        if process.returncode is None:
            _kill_group(process)
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        cancelled.cancel()
        for reader in readers:
            reader.cancel()
        await asyncio.gather(waiting, cancelled, *readers, return_exceptions=True)
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
            if entry.is_symlink() or not entry.is_file():
                continue
            found[entry.relative_to(dest).as_posix()] = entry.read_bytes()
    return found


def differences(before: Mapping[str, bytes], after: Mapping[str, bytes]) -> dict[str, bytes | None]:
    """Path -> new content (None: removed) for every file that differs."""
    changed: dict[str, bytes | None] = {
        path: content for path, content in after.items() if before.get(path) != content
    }
    changed.update({path: None for path in before if path not in after})
    return {path: changed[path] for path in sorted(changed)}
