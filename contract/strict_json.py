"""JSON text in, with duplicate object keys refused.

orjson (like most parsers) keeps the last of two equal keys, so ``{"a": 1, "a": 2}`` would
silently mean ``{"a": 2}``, and two parsers on a path may disagree on which value wins.
Finding duplicates costs little: once orjson has parsed the text, every key of the text is
one colon outside a string, and every key that survived is one entry of a parsed object. The
two counts differ exactly when a key repeats. The colons of the raw text are counted first
(in C); only when strings hold colons are the strings cut out (one C regex pass) and the
colons counted again (in a large text, counted inside the strings, match by match, which
holds no copy). The slow parse that names the repeated key runs only on a refusal.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# A JSON string token, escapes included; on text orjson accepted it matches strings exactly.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')


class DuplicateKeyError(ValueError):
    """An object of the text names ``key`` twice (``None``: not located)."""

    def __init__(self, key: str | None) -> None:
        named = f"the key {key!r}" if key is not None else "a key"
        super().__init__(f"{named} appears twice in one JSON object")
        self.key = key


def entry_count(value: Any) -> int:
    """How many entries the objects of a parsed JSON value hold, all levels (no recursion)."""
    count = 0
    stack = [value]
    pop, extend = stack.pop, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is dict:
            count += len(item)
            extend(item.values())
        elif kind is list:
            extend(item)
    return count


def has_duplicate_keys(text: bytes, value: Any) -> bool:
    """Whether ``text`` (which parsed to ``value``) names a key twice in one object."""
    colons = text.count(b":")
    if colons == 0:
        return False
    entries = entry_count(value)
    if colons == entries:
        return False
    return colons - _colons_in_strings(text) != entries


# Past this size the strings' colons are counted match by match: cutting the strings out
# (``re.sub``) holds a piece per string, about 8 times the text (234 MiB for a 27 MiB
# session.import), where counting holds nothing; below it, cutting is twice as fast.
_CUT_MAX_BYTES = 64 * 1024


def _colons_in_strings(text: bytes) -> int:
    if len(text) <= _CUT_MAX_BYTES:
        return text.count(b":") - _STRING.sub(b"", text).count(b":")
    count = text.count
    return sum([count(b":", *match.span()) for match in _STRING.finditer(text)])


def unique_pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
    """An ``object_pairs_hook`` for the standard library's parser that refuses a repeated key."""
    result = dict(items)
    if len(result) != len(items):
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return result


def _locate(text: bytes) -> DuplicateKeyError:
    """The first repeated key, by the standard library's parser (only on a refusal)."""
    try:
        json.loads(text, object_pairs_hook=unique_pairs)
    except DuplicateKeyError as exc:
        return exc
    except (ValueError, RecursionError):
        pass
    return DuplicateKeyError(None)


def loads(text: bytes) -> Any:
    """``orjson.loads``, raising ``DuplicateKeyError`` when an object repeats a key."""
    value = orjson.loads(text)
    if has_duplicate_keys(text, value):
        raise _locate(text)
    return value
