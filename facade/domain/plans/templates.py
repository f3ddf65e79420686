"""``{{name}}`` templates over plan inputs and step arguments.

A string that is exactly one placeholder takes the value itself (a number stays a
number, a list a list); placeholders inside longer text are replaced by the value's
text. ``{{a.b}}`` reaches into nested objects. An unknown name is an error, never an
empty string, so a typo cannot silently write the wrong file.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][\w-]*(?:\.[\w-]+)*)\s*\}\}")


class TemplateError(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(f"no value for placeholder {{{{{name}}}}}")
        self.name = name


def as_text(value: Any) -> str:
    """The text of a JSON value; integral floats (Struct numbers) print as integers."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return str(value)
    if value is None:
        return "null"
    return json.dumps(value, sort_keys=True)


def lookup(values: Mapping[str, Any], dotted: str) -> Any:
    current: Any = values
    for part in dotted.split("."):
        if not isinstance(current, Mapping) or part not in current:
            raise TemplateError(dotted)
        current = current[part]
    return current


def render_text(template: str, values: Mapping[str, Any]) -> str:
    return _PLACEHOLDER.sub(lambda m: as_text(lookup(values, m.group(1))), template)


def render(value: Any, values: Mapping[str, Any]) -> Any:
    """Render every string inside a JSON value."""
    if isinstance(value, str):
        whole = _PLACEHOLDER.fullmatch(value)
        if whole is not None:
            return lookup(values, whole.group(1))
        return render_text(value, values)
    if isinstance(value, Mapping):
        return {key: render(item, values) for key, item in value.items()}
    if isinstance(value, list):
        return [render(item, values) for item in value]
    return value
