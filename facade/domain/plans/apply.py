"""Writing a plan's artifacts into the project, all or nothing, even across a ``kill -9``.

The protocol: (1) one store transaction records the checkpoint (every pre-image, and a
digest of every post-image) and marks the plan's journal ``applying``; (2) each file is
written to a temporary file beside it, synced, and renamed over the target (deletes
unlink); (3) one transaction marks the journal ``applied`` with the plan's new state.
A server that finds a journal still ``applying`` at start restores every pre-image from
the checkpoint (``restore``), so the project holds none of the plan's changes, and
records the apply as failed with reason ``interrupted``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pathlib
import secrets
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.plans import paths
from cleveragents.acp.facade.domain.plans.paths import ResourceRoot
from cleveragents.acp.facade.domain.plans.records import CheckpointEntry
from cleveragents.acp.facade.domain.plans.staging import StagedArtifact

# Test hook: when set to a path, apply creates ``<path>.<n>`` after writing its n-th file,
# and waits there while the file ``<path>`` exists holding the number n, so a test can
# kill the process between two files.
PAUSE_ENV = "ACP_TEST_APPLY_PAUSE_FILE"
_TEMP_MARK = ".acp-apply-"


@dataclass(frozen=True)
class Write:
    entry: CheckpointEntry
    target: pathlib.Path
    content: bytes | None


def _digest(content: bytes | None) -> str:
    return hashlib.sha256(content).hexdigest() if content is not None else ""


def _missing_dirs(root: pathlib.Path, target: pathlib.Path) -> list[str]:
    """Folders between ``root`` and ``target`` that do not exist yet, outermost first."""
    missing: list[str] = []
    folder = target.parent
    while folder != root and not folder.exists():
        missing.append(folder.relative_to(root).as_posix())
        folder = folder.parent
    return list(reversed(missing))


def prepare(artifacts: Sequence[StagedArtifact], resources: Mapping[str, ResourceRoot]) -> list[Write]:
    """The writes and their checkpoint; INVALID_PARAMS for a path that now leads outside
    its resource, into a read-only one, or onto something that is not a file."""
    writes: list[Write] = []
    for artifact in artifacts:
        root = resources.get(artifact.resource)
        if root is None:
            raise ACPError(
                ErrorCode.INVALID_STATE,
                f"resource {artifact.resource!r} is no longer part of the project",
                {"resource": artifact.resource},
            )
        if root.read_only:
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                f"resource {root.name!r} is read-only",
                {"field": "resource", "resource": root.name},
            )
        try:
            writes.append(_prepare_one(artifact, root))
        except OSError as exc:
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                f"{artifact.path!r} cannot be written in resource {root.name!r}: {exc.strerror or exc}",
                {"field": "path", "path": artifact.path, "resource": root.name},
            ) from None
    return writes


def _prepare_one(artifact: StagedArtifact, root: ResourceRoot) -> Write:
    base = paths.real_root(root.root)
    target, canonical = paths.resolve(base, artifact.path)
    if canonical != artifact.path:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"{artifact.path!r} now resolves to {canonical!r} (a symlink changed)",
            {"field": "path", "path": artifact.path},
        )
    if target.exists() and not target.is_file():
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"{artifact.path!r} is not a regular file in the project",
            {"field": "path", "path": artifact.path},
        )
    existed = target.is_file()
    entry = CheckpointEntry(
        resource=root.name,
        root=str(base),
        path=canonical,
        existed=existed,
        mode=stat.S_IMODE(target.stat().st_mode) if existed else None,
        pre=target.read_bytes() if existed else None,
        post_exists=artifact.content is not None,
        post_sha256=_digest(artifact.content),
        created_dirs=_missing_dirs(base, target) if artifact.content is not None else [],
    )
    return Write(entry, target, artifact.content)


def _default_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _sync_dir(folder: pathlib.Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _temp_prefix(name: str) -> str:
    """Temp files are named by a digest of the target's name, so a 255-byte name still
    leaves room for the mark (and recovery finds a target's temps by the same digest)."""
    return f"{_TEMP_MARK}{hashlib.sha256(name.encode('utf-8', 'surrogateescape')).hexdigest()[:16]}-"


def write_atomic(target: pathlib.Path, content: bytes, mode: int | None) -> None:
    """Temp file beside the target, synced, then renamed over it: a reader (or a crash)
    sees the old file or the new one, never half of one."""
    temp = target.parent / f"{_temp_prefix(target.name)}{secrets.token_hex(4)}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temp, mode if mode is not None else _default_mode())
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            temp.unlink()
        raise
    _sync_dir(target.parent)


def _remove(target: pathlib.Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        target.unlink()
        _sync_dir(target.parent)


def _pause(count: int) -> None:
    marker = os.environ.get(PAUSE_ENV)
    if not marker:
        return
    pathlib.Path(f"{marker}.{count}").touch()
    hold = pathlib.Path(marker)
    with contextlib.suppress(OSError):
        while hold.read_text().strip() == str(count):
            time.sleep(0.02)


def write_all(writes: Sequence[Write]) -> None:
    for count, write in enumerate(writes, start=1):
        if write.content is None:
            _remove(write.target)
        else:
            base = pathlib.Path(write.entry.root)
            for folder in write.entry.created_dirs:
                (base / folder).mkdir(exist_ok=True)
            write_atomic(write.target, write.content, write.entry.mode)
        _pause(count)


def _clean_temps(target: pathlib.Path) -> None:
    if not target.parent.is_dir():
        return
    for stray in target.parent.glob(f"{_temp_prefix(target.name)}*"):
        with contextlib.suppress(OSError):
            stray.unlink()


def restore(entries: Sequence[CheckpointEntry]) -> list[str]:
    """Put every pre-image back (idempotent: safe to run again after a crash in it);
    returns the paths it restored."""
    restored: list[str] = []
    for entry in reversed(entries):
        base = pathlib.Path(entry.root)
        target = base / entry.path
        _clean_temps(target)
        if entry.existed:
            assert entry.pre is not None
            current = target.read_bytes() if target.is_file() else None
            if current != entry.pre or stat.S_IMODE(target.stat().st_mode) != entry.mode:
                target.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(target, entry.pre, entry.mode)
        else:
            _remove(target)
        for folder in reversed(entry.created_dirs):
            with contextlib.suppress(OSError):
                (base / folder).rmdir()
        restored.append(entry.path)
    return list(reversed(restored))
