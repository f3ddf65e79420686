"""Reading context files out of a resource folder, without ever leaving it.

Pure file-system code (no store, no registries), so the context service can run it in a
worker thread. Paths are relative POSIX paths under the folder; a path that escapes it
(``..``, absolute, a symlink pointing outside) is refused, binary and oversized files are
skipped with the reason, and directories named in ``SKIPPED_DIRS`` are never walked.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from cleveragents.acp.facade.domain.globs import matches_any

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


def _inside(real_root: str, real: str) -> bool:
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def read_text(real_root: str, relative: str) -> FileText:
    """The text of a file already known to lie inside ``real_root`` (a resolved path)."""
    full = os.path.join(real_root, *relative.split("/"))
    try:
        info = os.lstat(full)
        if stat.S_ISLNK(info.st_mode):
            target = os.path.realpath(full)
            if not _inside(real_root, target):
                return FileText(relative, None, "symlink leading outside the resource folder")
            info = os.stat(target)
            full = target
        if not stat.S_ISREG(info.st_mode):
            return FileText(relative, None, "not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            return FileText(relative, None, f"{info.st_size} bytes, over the {MAX_FILE_BYTES}-byte file cap")
        with open(full, "rb") as handle:
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


def locate(root: str, relative: str) -> tuple[str, str]:
    """(resolved folder, checked relative path) for one file the context could hold.

    PathEscapeError when the path leaves the folder in any way; NotAnItemError when it
    does not exist, or lies in a skipped or symlinked directory the walk never enters."""
    segments = check_relative(relative)
    real_root = os.path.realpath(root)
    current = real_root
    for index, segment in enumerate(segments):
        current = os.path.join(current, segment)
        last = index == len(segments) - 1
        if not last and segment in SKIPPED_DIRS:
            raise NotAnItemError(f"{segment}/ directories are never part of the context")
        try:
            info = os.lstat(current)
        except OSError:
            raise NotAnItemError(f"{relative!r} does not exist in the folder") from None
        if stat.S_ISLNK(info.st_mode):
            if not _inside(real_root, os.path.realpath(current)):
                raise PathEscapeError(f"{relative!r} goes through a symlink leading outside the folder")
            if not last:
                raise NotAnItemError("symlinked directories are not followed")
        elif not last and not stat.S_ISDIR(info.st_mode):
            raise NotAnItemError(f"{relative!r} does not exist in the folder")
    try:
        is_file = stat.S_ISREG(os.stat(current).st_mode)
    except OSError:
        is_file = False
    if not is_file:
        raise NotAnItemError(f"{relative!r} is not a file")
    return real_root, relative


def matching_files(root: str, globs: list[str]) -> tuple[str, list[str], int]:
    """(resolved folder, the first MAX_FILES_PER_SOURCE matching paths in path order, how many
    matched in all). Symlinked directories are not followed; symlinked files are listed."""
    real_root = os.path.realpath(root)
    found: list[str] = []
    for directory, dirnames, filenames in os.walk(real_root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS)
        base = os.path.relpath(directory, real_root)
        for name in filenames:
            relative = name if base == "." else f"{base.replace(os.sep, '/')}/{name}"
            if matches_any(relative, globs):
                found.append(relative)
    found.sort()
    return real_root, found[:MAX_FILES_PER_SOURCE], len(found)


def folder_problem(root: str) -> str | None:
    """Why a resource folder cannot be read, or None."""
    if not os.path.isabs(root):
        return f"the resource path {root!r} is not absolute"
    if not os.path.isdir(root):
        return f"the resource folder {root} does not exist or is not a directory"
    return None
