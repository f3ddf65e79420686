"""How deep a JSON value nests, and how deep params may nest.

Its own module because both converters measure it: ``codec`` refuses params deeper than
``MAX_DEPTH`` before json_format recurses into them, and ``codec_fast`` hands json_format a
well-known type's value only when it is shallow enough.
"""

from __future__ import annotations

from typing import Any

# Deeper JSON than this is refused before the parser sees it.
MAX_DEPTH = 64


def depth(value: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of a JSON value, without recursion (so no RecursionError)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        stack.extend((child, level + 1) for child in children)
    return deepest
