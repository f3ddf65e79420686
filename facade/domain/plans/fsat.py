"""File operations under a resource folder that no symlink can redirect.

The resource folder is reached from a descriptor of the operator's resource root (its
``Anchor``), and every path below it is resolved relative to a descriptor without
following any symlink (``beneath``: ``openat2`` with ``RESOLVE_BENEATH |
RESOLVE_NO_SYMLINKS``, else an ``O_NOFOLLOW`` walk); files are created, renamed and
removed with ``dir_fd``. Whatever is swapped for a symlink, above the resource folder or
in it, at any moment, the operation either stays inside or fails with ``OSError``
(ELOOP, ENOTDIR): it never reads, writes or deletes outside.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from cleveragents.acp.facade.domain import beneath
from cleveragents.acp.facade.domain.beneath import Anchor


@contextlib.contextmanager
def open_root(anchor: Anchor) -> Iterator[int]:
    """A descriptor of the resource folder, reached from the operator's root."""
    with beneath.open_anchor(anchor) as fd:
        yield fd


@contextlib.contextmanager
def open_parent(root_fd: int, path: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """The folder holding ``path`` (a canonical relative path) and the last name; with
    ``create``, missing folders are made on the way (mode 0777 & ~umask)."""
    *folders, name = path.split("/")
    try:
        fd = beneath.open_at(root_fd, "/".join(folders))
    except FileNotFoundError:
        if not create:
            raise
        fd = _make_folders(root_fd, folders)
    try:
        yield fd, name
    finally:
        os.close(fd)


def _make_folders(root_fd: int, folders: list[str]) -> int:
    """The folder ``folders`` names, made where missing, one name at a time."""
    fd = os.dup(root_fd)
    try:
        for folder in folders:
            try:
                next_fd = beneath.open_at(fd, folder)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(folder, 0o777, dir_fd=fd)
                next_fd = beneath.open_at(fd, folder)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass(frozen=True)
class FileState:
    """A regular file's bytes and permission bits; ``content`` None: no regular file."""

    content: bytes | None
    mode: int | None = None
    other: bool = False  # something that is not a regular file is there


def read(root_fd: int, path: str) -> FileState:
    """What is at ``path``: a missing file (or folder on the way) is ``FileState(None)``."""
    try:
        fd = beneath.open_at(root_fd, path, beneath.FILE_FLAGS)
    except FileNotFoundError:
        return FileState(None)
    except OSError as exc:
        if crosses_link(exc):
            return FileState(None, other=True)
        raise
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return FileState(None, other=True)
        return FileState(handle.read(), stat.S_IMODE(info.st_mode))


def crosses_link(exc: OSError) -> bool:
    """Whether an error means a symlink (or a non-folder) was met where a folder was."""
    return exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENXIO, errno.EXDEV)


def missing_dirs(root_fd: int, path: str) -> list[str]:
    """The folders on the way to ``path`` that do not exist yet, outermost first."""
    *folders, _name = path.split("/")
    missing: list[str] = []
    fd = os.dup(root_fd)
    try:
        for depth, folder in enumerate(folders):
            try:
                next_fd = beneath.open_at(fd, folder)
            except FileNotFoundError:
                missing = ["/".join(folders[: i + 1]) for i in range(depth, len(folders))]
                break
            os.close(fd)
            fd = next_fd
    finally:
        os.close(fd)
    return missing


def sync_dir(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.fsync(fd)


def write_atomic(
    root_fd: int,
    path: str,
    content: bytes,
    mode: int,
    temp_name: str,
    *,
    before_rename: Callable[[], None] | None = None,
) -> None:
    """``content`` to a temp file beside the target, synced, renamed over it: a reader
    (or a crash) sees the old file or the new one. Missing folders are created.
    ``before_rename`` may raise to leave the target as it is (the temp file is removed)."""
    with open_parent(root_fd, path, create=True) as (parent, name):
        fd = os.open(
            temp_name,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=parent,
        )
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)
                handle.flush()
                os.fchmod(handle.fileno(), mode)
                os.fsync(handle.fileno())
            if before_rename is not None:
                before_rename()
            os.replace(temp_name, name, src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temp_name, dir_fd=parent)
            raise
        sync_dir(parent)


def remove(root_fd: int, path: str) -> bool:
    """Unlink ``path`` (a symlink there is removed, never followed); gone already: no-op.
    A folder on the way that is now a symlink (or a file): nothing is done, and False."""
    try:
        with open_parent(root_fd, path) as (parent, name), contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=parent)
            sync_dir(parent)
    except FileNotFoundError:
        return True
    except OSError as exc:
        if not crosses_link(exc):
            raise
        return False
    return True


def remove_dir(root_fd: int, path: str) -> None:
    """Remove an empty folder; anything else (not empty, a symlink, gone) is left."""
    with contextlib.suppress(OSError), open_parent(root_fd, path) as (parent, name):
        os.rmdir(name, dir_fd=parent)


def remove_matching(root_fd: int, path: str, prefix: str) -> None:
    """Unlink the entries beside ``path`` whose names start with ``prefix`` (temp files)."""
    with contextlib.suppress(OSError), open_parent(root_fd, path) as (parent, _name):
        for entry in os.listdir(parent):
            if entry.startswith(prefix):
                with contextlib.suppress(OSError):
                    os.unlink(entry, dir_fd=parent)
