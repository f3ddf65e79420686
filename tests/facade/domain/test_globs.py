"""Globs: the dialect's meaning, checked against a plain reference matcher, in time linear in
the path whatever the glob, and bounded in count and length."""

from __future__ import annotations

import time
from functools import cache

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleveragents.acp.facade.domain.bounded import globs

QUICK_SECONDS = 2.0


def _class_items(body: str) -> list[tuple[str, str]] | None:
    """(low, high) per item, read left to right; None for a reversed range."""
    items: list[tuple[str, str]] = []
    k = 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            if body[k] > body[k + 2]:
                return None
            items.append((body[k], body[k + 2]))
            k += 3
        else:
            items.append((body[k], body[k]))
            k += 1
    return items


def reference_segment(name: str, glob: str) -> bool:
    """Backtracking matcher of one segment: slow, but obviously what the dialect says."""

    @cache
    def at(i: int, j: int) -> bool:
        if j == len(glob):
            return i == len(name)
        char = glob[j]
        if char == "*":
            return at(i, j + 1) or (i < len(name) and at(i + 1, j))
        if i == len(name):
            return False
        if char == "?":
            return at(i + 1, j + 1)
        if char == "[" and (end := glob.find("]", j + 2)) != -1:
            body = glob[j + 1 : end]
            negate = body.startswith("!")
            items = _class_items(body[1:] if negate else body)
            if items is None:
                raise ValueError("reversed range")
            inside = any(low <= name[i] <= high for low, high in items)
            return inside != negate and at(i + 1, end + 1)
        return name[i] == char and at(i + 1, j + 1)

    return at(0, 0)


def reference(path: str, glob: str) -> bool:
    names, parts = path.split("/"), glob.split("/")

    @cache
    def at(i: int, j: int) -> bool:
        if j == len(parts):
            return i == len(names)
        if parts[j] == "**":
            if j == len(parts) - 1:
                return i < len(names)
            return at(i, j + 1) or (i < len(names) - 1 and names[i] != "" and at(i + 1, j))
        if i == len(names) or not reference_segment(names[i], parts[j]):
            return False
        return at(i + 1, j + 1)

    return at(0, 0)


@given(
    path=st.text(alphabet="ab.-/", max_size=10),
    glob=st.text(alphabet="ab.-/*?[]!", max_size=10),
)
@settings(max_examples=500, deadline=None)
def test_the_compiled_glob_agrees_with_the_reference_matcher(path: str, glob: str) -> None:
    try:
        expected = reference(path, glob)
    except ValueError:
        expected = False  # a reversed range matches nothing
    assert globs.matches(path, glob) is expected, (path, glob)


@pytest.mark.parametrize(
    ("path", "glob", "found"),
    [
        ("README.md", "*.md", True),
        ("docs/a.md", "*.md", False),
        ("docs/a.md", "**/*.md", True),
        ("a/x/y/b", "a/**/b", True),
        ("a/b", "a/**/b", True),
        ("docs/", "docs/**", True),
        ("docs", "docs/**", False),
        ("b.py", "[abc]*.py", True),
        ("a+b.(c)", "a+b.(c)", True),
        ("f\\o", "f\\o", True),
        ("é1.txt", "é*.txt", True),
        ("x", "x[z-a]", False),
        ("a/\nb", "**", True),
    ],
)
def test_the_dialect(path: str, glob: str, found: bool) -> None:
    assert globs.matches(path, glob) is found


@pytest.mark.parametrize(
    ("glob", "path"),
    [
        ("**/" * 10 + "x*y*z*w", "/".join(["a"] * 2000) + "/xyz"),
        ("*a*a*a*a*a*a*a*a*a*a*a*a*b", "a" * 5000),
        ("**/" * 100 + "*", "/".join(["ab"] * 1000)),
    ],
)
def test_pathological_globs_run_in_linear_time(glob: str, path: str) -> None:
    began = time.monotonic()
    globs.matches(path, glob)
    assert time.monotonic() - began < QUICK_SECONDS


def test_lists_of_globs_are_bounded() -> None:
    globs.check(["*"] * globs.MAX_GLOBS)
    globs.check(["a" * globs.MAX_GLOB_LENGTH])
    with pytest.raises(globs.GlobError, match="101 globs given; at most 100") as caught:
        globs.check(["*"] * (globs.MAX_GLOBS + 1))
    assert caught.value.index is None
    with pytest.raises(globs.GlobError, match="1025 characters long") as caught:
        globs.check(["*", "a" * (globs.MAX_GLOB_LENGTH + 1)])
    assert caught.value.index == 1
    with pytest.raises(globs.GlobError, match="must not be empty"):
        globs.check([""])
