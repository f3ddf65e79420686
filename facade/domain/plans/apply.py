"""Writing a plan's artifacts into the project, all or nothing, even across a ``kill -9``.

The protocol: (1) one store transaction records the checkpoint (every pre-image, and a
digest of every post-image) and marks the plan's journal ``applying``; (2) each file is
written to a temporary file beside it, synced, and renamed over the target (deletes
unlink), every path resolved from a descriptor of the operator's resource root without
following a symlink (``fsat``), so a folder swapped for a symlink, above the resource or
in it, cannot redirect a write or a delete outside; before each file and before each
rename the plan's lease is checked (``fence``), so a holder that lost it (frozen while
another process took the plan over and restored it) writes nothing more; (3) one
transaction marks the journal ``applied`` with the plan's new state. A server that finds
a journal still ``applying`` at start restores every pre-image from the checkpoint
(``restore_all``), so the project holds none of the plan's changes, and records the apply as
failed with reason ``interrupted``.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import pathlib
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.beneath import Anchor
from cleveragents.acp.facade.domain.plans import fsat, paths
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
    anchor: Anchor


# Where each checkpoint's folder is opened from, looked up again (against the operator's
# resource roots as they are now) by every operation that touches the files.
Anchors = Mapping[str, Anchor | None]
# Raises (the plan's lease is lost) unless the caller may still write the plan's files.
Fence = Callable[[], None]


def anchors_of(writes: Sequence[Write]) -> dict[str, Anchor | None]:
    """The anchors apply resolved, for undoing its own writes."""
    return {write.entry.root: write.anchor for write in writes}


def _digest(content: bytes | None) -> str:
    return hashlib.sha256(content).hexdigest() if content is not None else ""


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
    anchor = root.place
    base = paths.real_root(root.root)
    target, canonical = paths.resolve(base, artifact.path)
    if canonical != artifact.path:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"{artifact.path!r} now resolves to {canonical!r} (a symlink changed)",
            {"field": "path", "path": artifact.path},
        )
    with fsat.open_root(anchor) as root_fd:
        current = fsat.read(root_fd, canonical)
        created = fsat.missing_dirs(root_fd, canonical) if artifact.content is not None else []
    if current.other:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"{artifact.path!r} is not a regular file in the project",
            {"field": "path", "path": artifact.path},
        )
    entry = CheckpointEntry(
        resource=root.name,
        root=anchor.folder,
        path=canonical,
        existed=current.content is not None,
        mode=current.mode,
        pre=current.content,
        post_exists=artifact.content is not None,
        post_sha256=_digest(artifact.content),
        created_dirs=created,
    )
    return Write(entry, target, artifact.content, anchor)


def _read_umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


# Read once: ``os.umask`` is process-wide, and writes run on worker threads.
_DEFAULT_MODE = 0o666 & ~_read_umask()


def _temp_prefix(name: str) -> str:
    """Temp files are named by a digest of the target's name, so a 255-byte name still
    leaves room for the mark (and recovery finds a target's temps by the same digest)."""
    return f"{_TEMP_MARK}{hashlib.sha256(name.encode('utf-8', 'surrogateescape')).hexdigest()[:16]}-"


def _write(root_fd: int, path: str, content: bytes, mode: int | None, fence: Fence | None = None) -> None:
    name = path.rsplit("/", 1)[-1]
    temp = f"{_temp_prefix(name)}{secrets.token_hex(4)}"
    fsat.write_atomic(
        root_fd, path, content, mode if mode is not None else _DEFAULT_MODE, temp, before_rename=fence
    )


def _pause(count: int) -> None:
    marker = os.environ.get(PAUSE_ENV)
    if not marker:
        return
    pathlib.Path(f"{marker}.{count}").touch()
    hold = pathlib.Path(marker)
    with contextlib.suppress(OSError):
        while hold.read_text().strip() == str(count):
            time.sleep(0.02)


class CrossedLinkError(OSError):
    """A write met a symlink (or a file) where a folder of ``path`` was: never followed."""

    def __init__(self, path: str, cause: OSError) -> None:
        super().__init__(cause.errno, f"a folder on the way to {path!r} is now a symlink or a file")
        self.path = path


def _unfenced() -> None:
    """No lease to check (a caller that holds the files some other way, as tests do)."""


def write_all(writes: Sequence[Write], fence: Fence = _unfenced) -> None:
    """Blocking (fsync): run it off the event loop. ``fence`` runs before each file and
    before each rename: whatever it raises stops the writes at once, nothing undone (the
    lease's new holder restores the checkpoint). OSError when a write failed (a
    CrossedLinkError when its path met a symlink or a file where a folder was): the caller
    restores the checkpoint."""
    for count, write in enumerate(writes, start=1):
        fence()
        try:
            with fsat.open_root(write.anchor) as root_fd:
                if write.content is None:
                    if not fsat.remove(root_fd, write.entry.path):
                        raise OSError(errno.ELOOP, "symlink on the way")
                else:
                    _write(root_fd, write.entry.path, write.content, write.entry.mode, fence)
        except OSError as exc:
            if fsat.crosses_link(exc):
                raise CrossedLinkError(write.entry.path, exc) from exc
            raise
        _pause(count)


@dataclass(frozen=True)
class Restored:
    """What ``restore`` did: paths put back, and paths left alone because a folder on the
    way is now a symlink or a file (never followed)."""

    restored: list[str]
    skipped: list[str]


def restore_all(entries: Sequence[CheckpointEntry], anchors: Anchors) -> Restored:
    """Put every pre-image back (idempotent: safe to run again after a crash in it). A path
    that now crosses a symlink or a non-folder is left alone (never followed) and reported
    skipped, as is one whose folder has no anchor (it lies outside the operator's resource
    roots now). Blocking: run it off the event loop."""
    restored: list[str] = []
    skipped: list[str] = []
    for entry in reversed(entries):
        anchor = anchors.get(entry.root)
        if anchor is None:
            skipped.append(entry.path)
            continue
        try:
            with fsat.open_root(anchor) as root_fd:
                (restored if _restore_one(root_fd, entry) else skipped).append(entry.path)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if not fsat.crosses_link(exc):
                raise
            skipped.append(entry.path)
    return Restored(list(reversed(restored)), list(reversed(skipped)))


def _restore_one(root_fd: int, entry: CheckpointEntry) -> bool:
    name = entry.path.rsplit("/", 1)[-1]
    fsat.remove_matching(root_fd, entry.path, _temp_prefix(name))
    if entry.existed:
        assert entry.pre is not None
        current = fsat.read(root_fd, entry.path)
        if current.content != entry.pre or current.mode != entry.mode:
            try:
                _write(root_fd, entry.path, entry.pre, entry.mode)
            except OSError as exc:
                if fsat.crosses_link(exc):
                    return False
                raise
    elif not fsat.remove(root_fd, entry.path):
        return False
    for folder in reversed(entry.created_dirs):
        fsat.remove_dir(root_fd, folder)
    return True
