"""File operations under a resource folder that no symlink can redirect.

Every path is walked from a file descriptor of the resource folder one name at a time,
each opened with ``O_NOFOLLOW`` relative to the previous one (``openat``), and files are
created, renamed and removed with ``dir_fd``. Whatever is swapped for a symlink, at any
moment, the operation either stays inside the folder or fails with ``OSError`` (ELOOP,
ENOTDIR): it never reads, writes or deletes outside.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@contextlib.contextmanager
def open_root(root: str) -> Iterator[int]:
    """A descriptor of the resource folder (itself not followed if it became a symlink)."""
    fd = os.open(root, _DIR_FLAGS)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def open_parent(root_fd: int, path: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
    """The folder holding ``path`` (a canonical relative path) and the last name; with
    ``create``, missing folders are made on the way (mode 0777 & ~umask)."""
    *folders, name = path.split("/")
    fd = os.dup(root_fd)
    try:
        for folder in folders:
            try:
                next_fd = os.open(folder, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):
                    os.mkdir(folder, 0o777, dir_fd=fd)
                next_fd = os.open(folder, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        yield fd, name
    finally:
        os.close(fd)


@dataclass(frozen=True)
class FileState:
    """A regular file's bytes and permission bits; ``content`` None: no regular file."""

    content: bytes | None
    mode: int | None = None
    other: bool = False  # something that is not a regular file is there


def read(root_fd: int, path: str) -> FileState:
    """What is at ``path``: a missing file (or folder on the way) is ``FileState(None)``."""
    try:
        with open_parent(root_fd, path) as (parent, name):
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
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
    return exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.ENXIO)


def missing_dirs(root_fd: int, path: str) -> list[str]:
    """The folders on the way to ``path`` that do not exist yet, outermost first."""
    *folders, _name = path.split("/")
    missing: list[str] = []
    fd = os.dup(root_fd)
    try:
        for depth, folder in enumerate(folders):
            try:
                next_fd = os.open(folder, _DIR_FLAGS, dir_fd=fd)
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


def write_atomic(root_fd: int, path: str, content: bytes, mode: int, temp_name: str) -> None:
    """``content`` to a temp file beside the target, synced, renamed over it: a reader
    (or a crash) sees the old file or the new one. Missing folders are created."""
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
