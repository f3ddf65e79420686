"""Opening folders and files below a directory descriptor without ever following a symlink.

Every file operation on a resource starts from a descriptor of the operator's resource
root (an ``Anchor``) and resolves the rest relative to it: with ``openat2`` and
``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`` where the kernel has it (the kernel resolves the
whole path atomically and refuses any symlink or escape), else one name at a time, each
``openat`` with ``O_NOFOLLOW | O_DIRECTORY`` relative to the previous folder. A folder
swapped for a symlink at any moment makes the open fail (ELOOP, ENOTDIR); it never leads
outside. A tenant owns what is below its root, so everything below is distrusted; the
root's own path is the operator's, resolved when the anchor is made.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import platform
import posixpath
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# A symlinked file (a context source may list one) is followed this many times at most.
MAX_LINK_HOPS = 8

_RESOLVE_NO_SYMLINKS = 0x04
_RESOLVE_BENEATH = 0x08
# openat2 has the same number on every architecture that has it (it came after the
# syscall tables were unified).
_OPENAT2 = 437 if platform.system() == "Linux" and platform.machine() in ("x86_64", "aarch64") else None

# Test hook: called with each folder name of a per-component walk before it is opened,
# so a test can swap a folder at that exact moment.
on_component: Callable[[str], None] | None = None


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _Kernel:
    """Whether ``openat2`` works here; set False at the first ENOSYS (or a filter's EPERM)."""

    openat2: bool = _OPENAT2 is not None
    libc: ctypes.CDLL | None = None


def _syscall() -> ctypes.CDLL:
    if _Kernel.libc is None:
        _Kernel.libc = ctypes.CDLL(None, use_errno=True)
    return _Kernel.libc


def _openat2(dir_fd: int, path: str, flags: int) -> int | None:
    """The descriptor, None when the kernel lacks ``openat2``; OSError as ``openat``."""
    if not _Kernel.openat2 or _OPENAT2 is None:
        return None
    how = _OpenHow(flags & ~os.O_NOFOLLOW, 0, _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS)
    encoded = os.fsencode(path)
    for _ in range(3):
        fd = _syscall().syscall(_OPENAT2, dir_fd, encoded, ctypes.byref(how), ctypes.sizeof(how))
        if fd >= 0:
            return int(fd)
        code = ctypes.get_errno()
        if code in (errno.ENOSYS, errno.EPERM):
            # No such syscall, or a seccomp filter that refuses it: walk instead, from now on.
            _Kernel.openat2 = False
            return None
        if code not in (errno.EAGAIN, errno.EINTR):
            raise OSError(code, os.strerror(code), path)
    return None


def _walk_open(dir_fd: int, parts: list[str], flags: int) -> int:
    fd = os.dup(dir_fd)
    try:
        for part in parts[:-1]:
            if on_component is not None:
                on_component(part)
            next_fd = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        if on_component is not None:
            on_component(parts[-1])
        return os.open(parts[-1], flags | os.O_NOFOLLOW, dir_fd=fd)
    finally:
        os.close(fd)


def open_at(dir_fd: int, relative: str, flags: int = DIR_FLAGS) -> int:
    """A descriptor of ``relative`` (a canonical path: no ``.``, ``..`` or empty names; ""
    is ``dir_fd`` itself) below ``dir_fd``, no symlink followed on the way or at the end."""
    parts = [part for part in relative.split("/") if part]
    if not parts:
        return os.dup(dir_fd)
    if any(part in (".", "..") for part in parts):
        raise OSError(errno.EXDEV, "a path below a folder has no '.' or '..' names", relative)
    fd = _openat2(dir_fd, "/".join(parts), flags)
    return fd if fd is not None else _walk_open(dir_fd, parts, flags)


@dataclass(frozen=True)
class Anchor:
    """Where a resource folder is opened from: ``base``, a folder of the operator's (the
    resource root the resource lies in, resolved), and ``below``, the path from it to the
    resource folder, walked without following any symlink ("" for the root)."""

    base: str
    below: str = ""

    @property
    def folder(self) -> str:
        """The resource folder's path, for messages and records."""
        return posixpath.join(self.base, self.below) if self.below else self.base


@contextlib.contextmanager
def open_anchor(anchor: Anchor) -> Iterator[int]:
    """A descriptor of the resource folder, reached from the operator's root (resolved
    when the anchor was made, so its own last name is not followed either: a root, or a
    local resource folder, swapped for a symlink since is refused)."""
    base = os.open(anchor.base, DIR_FLAGS)
    try:
        fd = open_at(base, anchor.below) if anchor.below else os.dup(base)
    finally:
        os.close(base)
    try:
        yield fd
    finally:
        os.close(fd)


def anchor_below(base: str, folder: str) -> Anchor | None:
    """The anchor of ``folder`` (absolute) under ``base`` (absolute), judged by the names
    alone; None when ``folder`` is not ``base`` or below it."""
    base = posixpath.normpath(base)
    folder = posixpath.normpath(folder)
    if folder == base:
        return Anchor(base)
    prefix = base.rstrip("/") + "/"
    if not folder.startswith(prefix):
        return None
    return Anchor(base, folder[len(prefix) :])


def link_target(dir_fd: int, relative: str, folder: str = "") -> str | None:
    """Where the symlink ``relative`` points, as a canonical path below ``dir_fd`` (judged
    by the names, as the no-symlink open of it then checks); None when it points above it.
    An absolute target counts when it lies under ``folder``, the path ``dir_fd`` was opened
    by."""
    parent, _, name = relative.rpartition("/")
    with _closing(open_at(dir_fd, parent)) as fd:
        target = os.readlink(name, dir_fd=fd)
    parts: list[str] = [p for p in parent.split("/") if p]
    if target.startswith("/"):
        below = anchor_below(folder, target) if folder else None
        if below is None or below.base != posixpath.normpath(folder):
            return None
        parts, target = [], below.below
    for part in target.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts) or None


@contextlib.contextmanager
def _closing(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def open_file(dir_fd: int, relative: str, *, follow_links: bool = False, folder: str = "") -> int:
    """A file below ``dir_fd`` opened for reading. With ``follow_links``, a symlink as the
    last name is followed while its target stays below (canonically, never through another
    symlinked folder; EXDEV when it leads out); otherwise ELOOP. ``folder``: the path
    ``dir_fd`` was opened by, for absolute link targets."""
    for _ in range(MAX_LINK_HOPS + 1):
        try:
            return open_at(dir_fd, relative, FILE_FLAGS)
        except OSError as exc:
            if not follow_links or exc.errno != errno.ELOOP or not _last_is_link(dir_fd, relative):
                raise
        target = link_target(dir_fd, relative, folder)
        if target is None:
            raise OSError(errno.EXDEV, "a symlink leading outside the folder", relative)
        relative = target
    raise OSError(errno.ELOOP, "too many symlinks", relative)


def linked_file(dir_fd: int, relative: str, folder: str = "") -> str | None:
    """The canonical path (below ``dir_fd``) of the regular file the symlink ``relative``
    leads to, through a chain of symlinked files; None when it leads out, loops, or ends at
    anything else."""
    for _ in range(MAX_LINK_HOPS):
        try:
            target = link_target(dir_fd, relative, folder)
        except OSError:
            return None
        if target is None:
            return None
        try:
            fd = open_at(dir_fd, target, FILE_FLAGS)
        except OSError as exc:
            if exc.errno == errno.ELOOP and _last_is_link(dir_fd, target):
                relative = target
                continue
            return None
        try:
            return target if stat.S_ISREG(os.fstat(fd).st_mode) else None
        finally:
            os.close(fd)
    return None


def _last_is_link(dir_fd: int, relative: str) -> bool:
    parent, _, name = relative.rpartition("/")
    try:
        with _closing(open_at(dir_fd, parent)) as fd:
            return stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def walk(
    dir_fd: int, below: str = "", *, skip: frozenset[str] = frozenset()
) -> Iterator[tuple[str, os.DirEntry[str]]]:
    """Each entry under ``below`` (its path relative to ``dir_fd``, and the entry), read
    folder by folder from descriptors: a folder is entered by ``open_at`` (so one swapped
    for a symlink meanwhile is skipped, never followed). Folders named in ``skip`` are
    neither listed nor entered; unreadable folders are skipped."""
    pending = [below]
    while pending:
        folder = pending.pop()
        try:
            fd = open_at(dir_fd, folder)
        except OSError:
            continue
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    relative = f"{folder}/{entry.name}" if folder else entry.name
                    with contextlib.suppress(OSError):
                        if entry.is_dir(follow_symlinks=False):
                            if entry.name in skip:
                                continue
                            pending.append(relative)
                    yield relative, entry
        finally:
            os.close(fd)
