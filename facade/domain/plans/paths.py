"""Project-relative paths, resolved safely inside a directory resource.

Plans name files by POSIX paths relative to a resource folder. A path that is absolute,
climbs with ``..``, or reaches outside the folder through a symlink is INVALID_PARAMS:
nothing outside a project's resources is ever read or written. A path is resolved to
its canonical form (symlinks inside the folder followed), so one file has one name.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass

from cleveragents.acp.contract.errors import ACPError, ErrorCode

# A name longer than this is refused by every common file system (NAME_MAX).
MAX_COMPONENT_BYTES = 255
# A relative path longer than this is refused: with the resource folder in front it
# stays well under PATH_MAX (4096), and no diff header or listing grows without bound.
MAX_PATH_BYTES = 1024
# C0 and C1 controls and DEL: a newline in a name would forge diff headers and listings;
# the line and paragraph separators break lines too, and the bidirectional overrides and
# isolates (U+202E) show a name reversed in a reviewer's diff ("txt.exe" as "exe.txt").
_CONTROL = frozenset(
    chr(code)
    for code in (
        *range(0x20),
        *range(0x7F, 0xA0),
        0x2028,
        0x2029,
        *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
    )
)


@dataclass(frozen=True)
class ResourceRoot:
    """A project's directory resource: its registry name and its folder."""

    name: str
    root: pathlib.Path
    read_only: bool = False


def _invalid(message: str, field: str, path: str) -> ACPError:
    return ACPError(ErrorCode.INVALID_PARAMS, message, {"field": field, "path": path})


def normalize(path: str, *, field: str = "path", allow_root: bool = False) -> str:
    """The path without ``.`` segments, doubled or trailing slashes; ``""`` is the root.

    Refused (INVALID_PARAMS): control characters, backslashes (a Windows separator that
    POSIX keeps in a name), a name over 255 bytes, a path over 1024 bytes."""
    if not _CONTROL.isdisjoint(path):
        raise _invalid(
            "path contains a control character (or a line separator or bidi override)", field, path
        )
    if "\\" in path:
        raise _invalid("path contains a backslash; separate folders with '/'", field, path)
    if len(path.encode("utf-8", errors="surrogatepass")) > MAX_PATH_BYTES:
        raise _invalid(f"path is longer than {MAX_PATH_BYTES} bytes", field, path[:64])
    if path.startswith("/") or pathlib.PureWindowsPath(path).drive:
        raise _invalid(f"path {path!r} is absolute; give a path relative to the resource", field, path)
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise _invalid(f"path {path!r} climbs out with '..'", field, path)
    if not parts and not allow_root:
        raise _invalid("path names no file", field, path)
    for part in parts:
        if len(part.encode("utf-8", errors="surrogatepass")) > MAX_COMPONENT_BYTES:
            raise _invalid(f"a name in the path is longer than {MAX_COMPONENT_BYTES} bytes", field, path)
    return "/".join(parts)


def real_root(root: pathlib.Path) -> pathlib.Path:
    """The canonical resource folder; a folder that is gone is INVALID_STATE."""
    try:
        resolved = root.resolve(strict=True)
    except (OSError, RuntimeError):
        raise ACPError(
            ErrorCode.INVALID_STATE,
            f"resource folder {str(root)!r} does not exist",
            {"path": str(root)},
        ) from None
    if not resolved.is_dir():
        raise ACPError(
            ErrorCode.INVALID_STATE, f"resource path {str(root)!r} is not a folder", {"path": str(root)}
        )
    return resolved


def resolve(
    root: pathlib.Path, path: str, *, field: str = "path", allow_root: bool = False
) -> tuple[pathlib.Path, str]:
    """The absolute file and its canonical relative path, or INVALID_PARAMS when the
    path (through any symlink) leaves the folder."""
    relative = normalize(path, field=field, allow_root=allow_root)
    base = real_root(root)
    try:
        target = (base / relative).resolve(strict=False)
    except (OSError, RuntimeError):
        raise _invalid(f"path {path!r} cannot be resolved (symlink loop?)", field, path) from None
    if target != base and base not in target.parents:
        raise _invalid(f"path {path!r} leads outside the resource folder", field, path)
    canonical = target.relative_to(base).as_posix()
    if canonical == "." and not allow_root:
        raise _invalid(f"path {path!r} names the resource folder itself", field, path)
    return target, "" if canonical == "." else canonical


def inside(root: pathlib.Path, target: pathlib.Path) -> bool:
    """Whether an existing ``target`` (symlinks followed) lies in the folder ``root``."""
    try:
        resolved = target.resolve(strict=True)
    except (OSError, RuntimeError):
        return False
    return resolved == root or root in resolved.parents


def walk_files(root: pathlib.Path, below: str = "") -> list[str]:
    """Canonical relative paths of the regular files under ``below``, symlinks to files
    inside the folder resolved, links leading out skipped; sorted."""
    return sorted({found for found in _walk(root, below) if found is not None})


def first_files(root: pathlib.Path, limit: int) -> tuple[list[str], bool]:
    """``walk_files`` of the whole folder, but the walk stops after ``limit`` entries
    (folders, files, links it skips) and then says True: there may be more. Each file costs
    two realpath calls, so a caller that shows a few (a prompt's context) must not pay for
    a huge folder. Stopped early, the files are those met first, in the walk's order."""
    found: set[str] = set()
    for visited, canonical in enumerate(_walk(root, ""), start=1):
        if visited > limit:
            return sorted(found), True
        if canonical is not None:
            found.add(canonical)
    return sorted(found), False


def _walk(root: pathlib.Path, below: str) -> Iterator[str | None]:
    """Each entry ``walk_files`` meets, one at a time: a file's canonical path, or None (a
    folder, a link to a folder, a skipped link, anything not a regular file); a linked file
    may come twice. A folder is read entry by entry (``os.scandir``), never listed whole
    first as ``os.walk`` does, so a caller that stops early stops inside a folder of a
    million names too. Links are not walked into; unreadable folders are skipped."""
    base = real_root(root)
    start = base / below if below else base
    if not start.is_dir():
        return
    folders = [str(start)]
    while folders:
        try:
            entries = os.scandir(folders.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(entry.path)
                        yield None
                        continue
                    if entry.is_dir():
                        yield None
                        continue
                except OSError:
                    yield None
                    continue
                yield _canonical_file(base, pathlib.Path(entry.path), below)


def _canonical_file(base: pathlib.Path, entry: pathlib.Path, below: str) -> str | None:
    """A file entry's canonical path when it (or the file it links to) is a regular file
    inside the folder, and under ``below``."""
    if not inside(base, entry):
        return None
    resolved = entry.resolve()
    canonical = resolved.relative_to(base).as_posix()
    if resolved.is_file() and (not below or canonical.startswith(below + "/")):
        return canonical
    return None
