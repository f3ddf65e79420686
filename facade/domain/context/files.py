"""Reading context files out of a resource folder, without ever leaving it.

Pure file-system code (no store, no registries), so the context service can run it in a
worker thread. Paths are relative POSIX paths under the folder; a path that escapes it
(``..``, absolute, a symlink pointing outside) is refused, binary and oversized files are
skipped with the reason, and directories named in ``SKIPPED_DIRS`` are never walked.
Every look, listing and read starts from a descriptor of the operator's resource root
(the folder's ``Anchor``) and follows no symlinked folder (``beneath``), so a folder
swapped for a symlink between a check and a read never yields outside content.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from cleveragents.acp.facade.domain import beneath
from cleveragents.acp.facade.domain.beneath import Anchor
from cleveragents.acp.facade.domain.bounded.globs import matches_any

MAX_FILE_BYTES = 1024 * 1024
MAX_FILES_PER_SOURCE = 2000
# Version-control internals are never context.
SKIPPED_DIRS = frozenset({".git", ".hg", ".svn"})
_BINARY_PROBE = 8192


class PathEscapeError(ValueError):
    """The path names something outside the folder."""


class NotAnItemError(LookupError):
    """The path exists in no form the context would use."""


@dataclass(frozen=True)
class FileText:
    """A file's text, or why it cannot be context (``content`` is None then)."""

    path: str
    content: str | None
    reason: str = ""


def check_relative(path: str) -> list[str]:
    """The segments of a relative path, or PathEscapeError saying what is wrong."""
    if not path:
        raise PathEscapeError("the path is empty")
    if "\x00" in path:
        raise PathEscapeError("the path contains a NUL character")
    if path.startswith("/") or "\\" in path:
        raise PathEscapeError(f"{path!r} is not a relative POSIX path inside the folder")
    segments = path.split("/")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise PathEscapeError(f"{path!r} has an empty, '.' or '..' segment")
    return segments


def _link_inside(fd: int, relative: str, anchor: Anchor) -> str | None:
    """Where the symlink ``relative`` leads, canonically below the folder; None: outside."""
    try:
        return beneath.link_target(fd, relative, anchor.folder)
    except OSError:
        return None


def read_text(anchor: Anchor, relative: str) -> FileText:
    """The text of a file in the folder ``anchor`` reaches, opened from the operator's root
    without following a symlink on the way (a symlinked file is followed while it stays in
    the folder): a folder swapped for a symlink at any moment makes it unreadable, never
    outside content."""
    try:
        with beneath.open_anchor(anchor) as root_fd:
            fd = beneath.open_file(root_fd, relative, follow_links=True, folder=anchor.folder)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            return FileText(relative, None, "symlink leading outside the resource folder")
        return FileText(relative, None, f"unreadable: {exc.strerror or exc}")
    try:
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                return FileText(relative, None, "not a regular file")
            if info.st_size > MAX_FILE_BYTES:
                return FileText(
                    relative, None, f"{info.st_size} bytes, over the {MAX_FILE_BYTES}-byte file cap"
                )
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        return FileText(relative, None, f"unreadable: {exc.strerror or exc}")
    if len(data) > MAX_FILE_BYTES:
        return FileText(relative, None, f"over the {MAX_FILE_BYTES}-byte file cap")
    if b"\x00" in data[:_BINARY_PROBE]:
        return FileText(relative, None, f"binary file (NUL byte in its first {_BINARY_PROBE} bytes)")
    try:
        return FileText(relative, data.decode("utf-8"))
    except UnicodeDecodeError:
        return FileText(relative, None, "binary file (not UTF-8 text)")


def locate(anchor: Anchor, relative: str) -> str:
    """The checked relative path of one file the context could hold, looked up from the
    operator's root without following a symlink on the way.

    PathEscapeError when the path leaves the folder in any way; NotAnItemError when it
    does not exist, or lies in a skipped or symlinked directory the walk never enters."""
    segments = check_relative(relative)
    try:
        with beneath.open_anchor(anchor) as root_fd:
            return _locate(root_fd, anchor, relative, segments)
    except OSError:
        raise NotAnItemError(f"{relative!r} does not exist in the folder") from None


def _locate(root_fd: int, anchor: Anchor, relative: str, segments: list[str]) -> str:
    for index, segment in enumerate(segments):
        here = "/".join(segments[: index + 1])
        last = index == len(segments) - 1
        if not last and segment in SKIPPED_DIRS:
            raise NotAnItemError(f"{segment}/ directories are never part of the context")
        try:
            with _parent(root_fd, here) as (parent, name):
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
        except OSError:
            raise NotAnItemError(f"{relative!r} does not exist in the folder") from None
        if stat.S_ISLNK(info.st_mode):
            target = _link_inside(root_fd, here, anchor)
            if target is None:
                raise PathEscapeError(f"{relative!r} goes through a symlink leading outside the folder")
            if not last:
                raise NotAnItemError("symlinked directories are not followed")
        elif not last and not stat.S_ISDIR(info.st_mode):
            raise NotAnItemError(f"{relative!r} does not exist in the folder")
    try:
        fd = beneath.open_file(root_fd, relative, follow_links=True, folder=anchor.folder)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            raise PathEscapeError(f"{relative!r} goes through a symlink leading outside the folder") from None
        raise NotAnItemError(f"{relative!r} is not a file") from None
    try:
        is_file = stat.S_ISREG(os.fstat(fd).st_mode)
    finally:
        os.close(fd)
    if not is_file:
        raise NotAnItemError(f"{relative!r} is not a file")
    return relative


@contextlib.contextmanager
def _parent(root_fd: int, relative: str) -> Iterator[tuple[int, str]]:
    folder, _, name = relative.rpartition("/")
    fd = beneath.open_at(root_fd, folder)
    try:
        yield fd, name
    finally:
        os.close(fd)


def matching_files(anchor: Anchor, globs: list[str]) -> tuple[list[str], int]:
    """(the first MAX_FILES_PER_SOURCE matching paths in path order, how many matched in
    all), read from the operator's root through no symlinked folder (those are listed by
    name, never entered; symlinked files are listed)."""
    found: list[str] = []
    try:
        with beneath.open_anchor(anchor) as root_fd:
            for relative, entry in beneath.walk(root_fd, skip=SKIPPED_DIRS):
                try:
                    if entry.is_dir(follow_symlinks=False) or (entry.is_symlink() and entry.is_dir()):
                        continue
                except OSError:
                    continue
                if matches_any(relative, globs):
                    found.append(relative)
    except OSError:
        return [], 0
    found.sort()
    return found[:MAX_FILES_PER_SOURCE], len(found)


def folder_problem(root: str) -> str | None:
    """Why a resource folder cannot be read, or None."""
    if not os.path.isabs(root):
        return f"the resource path {root!r} is not absolute"
    if not os.path.isdir(root):
        return f"the resource folder {root} does not exist or is not a directory"
    return None
