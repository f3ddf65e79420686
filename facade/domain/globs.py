"""Path globs over relative POSIX paths, the one glob dialect of the service.

A glob matches a whole path relative to a root (a resource folder, a project):
``*`` is any run of characters within one segment, ``?`` one character of a segment,
``[abc]``/``[!abc]`` a character class, and a segment that is exactly ``**`` any number
of segments, none included. So ``*.md`` matches ``README.md`` but not ``docs/a.md``;
``**/*.md`` matches both. There is no brace expansion.
"""

from __future__ import annotations

import re
from functools import lru_cache


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
            escaped = body.replace("\\", "\\\\").replace("^", "\\^")
            out.append(f"[{'^/' if negate else ''}{escaped}]")
            i = end
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


@lru_cache(maxsize=1024)
def compile_glob(pattern: str) -> re.Pattern[str]:
    segments = pattern.split("/")
    parts: list[str] = []
    for index, segment in enumerate(segments):
        last = index == len(segments) - 1
        if segment == "**":
            parts.append(".*" if last else "(?:[^/]+/)*")
        else:
            parts.append(_segment(segment) + ("" if last else "/"))
    return re.compile("".join(parts), re.DOTALL)


def matches(path: str, pattern: str) -> bool:
    """Whether the relative POSIX ``path`` matches ``pattern`` as a whole."""
    return compile_glob(pattern).fullmatch(path) is not None


def matches_any(path: str, patterns: list[str] | tuple[str, ...]) -> bool:
    """Whether ``path`` matches one of ``patterns``; an empty list matches everything."""
    return not patterns or any(matches(path, p) for p in patterns)
