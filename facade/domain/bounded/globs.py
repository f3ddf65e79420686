"""Path globs over relative POSIX paths, the one glob dialect of the service.

A glob matches a whole path relative to a root (a resource folder, a project):
``*`` is any run of characters within one segment, ``?`` one character of a segment,
``[abc]``/``[!abc]`` a character class, and a segment that is exactly ``**`` any number
of segments, none included. So ``*.md`` matches ``README.md`` but not ``docs/a.md``;
``**/*.md`` matches both. There is no brace expansion.

A glob is translated to an RE2 pattern: matching takes time linear in path length times
glob length whatever the glob (ten ``**/`` segments made Python's backtracking ``re`` take
seconds). Globs a caller writes are bounded by ``check``: ``MAX_GLOBS`` per list, each at
most ``MAX_GLOB_LENGTH`` characters.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import re2

MAX_GLOB_LENGTH = 1024
MAX_GLOBS = 100
CACHE_SIZE = 1024


class GlobError(ValueError):
    """A list of globs breaks a bound; ``index`` is the glob at fault, or None for the list."""

    def __init__(self, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.index = index


def check(globs: Sequence[str]) -> None:
    """GlobError unless every glob is non-empty and the list stays within the bounds."""
    if len(globs) > MAX_GLOBS:
        raise GlobError(f"{len(globs)} globs given; at most {MAX_GLOBS} are allowed")
    for index, glob in enumerate(globs):
        if not glob:
            raise GlobError("must not be empty", index)
        if len(glob) > MAX_GLOB_LENGTH:
            raise GlobError(f"is {len(glob)} characters long; at most {MAX_GLOB_LENGTH} are allowed", index)


def _literal(text: str) -> str:
    """``text`` as RE2 literal characters, each one escaped where RE2 would read it."""
    return "".join(c if c.isalnum() or not c.isascii() else "\\" + c for c in text)


def _segment(segment: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(segment):
        char = segment[i]
        if char == "*":
            while i + 1 < len(segment) and segment[i + 1] == "*":
                i += 1
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[" and (end := segment.find("]", i + 2)) != -1:
            body = segment[i + 1 : end]
            negate = body.startswith("!")
            body = body[1:] if negate else body
            # Each character is literal except a range's '-' between two of them.
            last = len(body) - 1
            items = "".join("-" if c == "-" and 0 < k < last else _literal(c) for k, c in enumerate(body))
            out.append(f"[{'^/' if negate else ''}{items}]")
            i = end
        else:
            out.append(_literal(char))
        i += 1
    return "".join(out)


def translate(pattern: str) -> str:
    """The RE2 pattern (to match a whole path) of a glob."""
    segments = pattern.split("/")
    parts: list[str] = []
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            parts.append("(?s:.*)" if last else "(?:[^/]+/)*")
        else:
            parts.append(_segment(segment) + ("" if last else "/"))
    return "".join(parts)


def _options() -> re2.Options:
    options = re2.Options()
    options.log_errors = False
    return options


@lru_cache(maxsize=CACHE_SIZE)
def compile_glob(pattern: str) -> re2._Regexp[str]:
    """The compiled glob; a class RE2 refuses (a reversed range ``[z-a]``) matches nothing."""
    try:
        return re2.compile(translate(pattern), _options())
    except re2.error:
        return re2.compile(r"[^\x{0}-\x{10ffff}]", _options())


def matches(path: str, pattern: str) -> bool:
    """Whether the relative POSIX ``path`` matches ``pattern`` as a whole."""
    return compile_glob(pattern).fullmatch(path) is not None


def matches_any(path: str, patterns: Sequence[str]) -> bool:
    """Whether ``path`` matches one of ``patterns``; an empty list matches everything."""
    return not patterns or any(matches(path, p) for p in patterns)
