"""The tools a model is offered, as chat-completions function tools, and the way back from
a function call the model makes to an ACP tool and its arguments.

Function names allow only ``[A-Za-z0-9_-]``, so ``fs.read`` is offered as ``fs_read``; the
table keeps the mapping both ways. Every function takes an optional ``reason``: the model's
stated reason for the call, which becomes the rationale of its decision node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

REASON = "reason"
_NAME = re.compile(r"[^A-Za-z0-9_-]")
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][\w-]*)")
MAX_NAME = 64

_RESOURCE = {
    "type": "string",
    "description": "The project resource the path is in; may be left out when the project has one.",
}
_PATH = {"type": "string", "description": "A path relative to the resource's folder."}

# The built-in file tools: what they do and their parameters.
BUILTIN: Mapping[str, tuple[str, dict[str, Any], list[str]]] = {
    "fs.read": (
        "Read a file of the project as this plan has staged it (its own changes included).",
        {"path": _PATH, "resource": _RESOURCE},
        ["path"],
    ),
    "fs.list": (
        "List the files below a folder of the project (the whole resource when path is empty).",
        {
            "path": {"type": "string", "description": "A folder relative to the resource's folder."},
            "resource": _RESOURCE,
        },
        [],
    ),
    "fs.write": (
        "Create or overwrite a file with the given content (staged; the project changes only at apply).",
        {"path": _PATH, "content": {"type": "string"}, "resource": _RESOURCE},
        ["path", "content"],
    ),
    "fs.replace": (
        "Replace exactly one occurrence of the text old with new in a file (staged).",
        {"path": _PATH, "old": {"type": "string"}, "new": {"type": "string"}, "resource": _RESOURCE},
        ["path", "old", "new"],
    ),
    "fs.delete": (
        "Delete a file (staged).",
        {"path": _PATH, "resource": _RESOURCE},
        ["path"],
    ),
}


@dataclass(frozen=True)
class Offered:
    """One ACP tool as the model sees it."""

    tool: str
    function: str
    schema: dict[str, Any]


def _parameters(properties: Mapping[str, Any], required: Sequence[str]) -> dict[str, Any]:
    props = dict(properties)
    props.setdefault(REASON, {"type": "string", "description": "Why you make this call, in one sentence."})
    return {"type": "object", "properties": props, "required": list(required)}


def function_tool(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


def command_parameters(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """A command tool's parameters: the placeholders of its argv (as text), and resource."""
    names = sorted({m.group(1) for part in argv for m in _PLACEHOLDER.finditer(part)} - {"resource"})
    properties: dict[str, Any] = {n: {"type": "string"} for n in names}
    properties["resource"] = _RESOURCE
    return properties, names


class Functions:
    """The function table of one model turn: ACP tool <-> function name."""

    def __init__(self) -> None:
        self.offered: list[Offered] = []
        self._by_function: dict[str, Offered] = {}

    def add(
        self, tool: str, description: str, properties: Mapping[str, Any], required: Sequence[str]
    ) -> None:
        base = _NAME.sub("_", tool)[:MAX_NAME] or "tool"
        name, n = base, 1
        while name in self._by_function:
            n += 1
            name = f"{base[: MAX_NAME - len(str(n)) - 1]}_{n}"
        offered = Offered(tool, name, function_tool(name, description, _parameters(properties, required)))
        self.offered.append(offered)
        self._by_function[name] = offered

    def add_builtin(self, tool: str) -> None:
        description, properties, required = BUILTIN[tool]
        self.add(tool, description, properties, required)

    @property
    def tools(self) -> list[dict[str, Any]]:
        return [o.schema for o in self.offered]

    @property
    def names(self) -> list[str]:
        return [o.tool for o in self.offered]

    def find(self, function: str) -> Offered | None:
        return self._by_function.get(function) or next((o for o in self.offered if o.tool == function), None)


class CallError(Exception):
    """A function call that cannot run; the message goes back to the model."""


def arguments(text: str) -> tuple[dict[str, Any], str]:
    """(arguments without ``reason``, the reason) from the model's JSON text."""
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        raise CallError(f"the arguments are not valid JSON ({exc}); send a JSON object") from None
    if not isinstance(value, dict):
        raise CallError("the arguments must be a JSON object")
    reason = value.pop(REASON, "")
    return value, reason if isinstance(reason, str) else json.dumps(reason)
