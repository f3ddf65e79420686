"""Which spec fields name entries of which kinds, and how to walk them.

References stay within one namespace. A path is dotted through the spec
(``steps.tool``); repeated fields fan out, so each hit carries its own field path
(``spec.steps[1].tool``) for error details.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from google.protobuf import message

from cleveragents.acp.facade.domain.registries.builtins import BUILTIN_TOOLS


@dataclass(frozen=True)
class Reference:
    path: str
    target: str


# Domain knowledge, not an operation list: the spec fields that are references.
REFERENCES: Mapping[str, tuple[Reference, ...]] = MappingProxyType(
    {
        "action": (
            Reference("actor", "actor"),
            Reference("validations", "validation"),
            Reference("invariants", "invariant"),
            Reference("skills", "skill"),
            Reference("automation_profile", "automation_profile"),
            Reference("steps.tool", "tool"),
        ),
        "actor": (Reference("skills", "skill"),),
        "automation_profile": (
            Reference("allowed_tools", "tool"),
            Reference("allowed_validations", "validation"),
        ),
        "project": (Reference("resources", "resource"),),
        "resource": (Reference("type", "resource_type"),),
    }
)


@dataclass(frozen=True)
class Hit:
    field: str
    target: str
    name: str


def _walk(value: Any, parts: list[str], prefix: str) -> Iterator[tuple[str, str]]:
    head, rest = parts[0], parts[1:]
    field = value.DESCRIPTOR.fields_by_name[head]
    items: Any = getattr(value, head)
    pairs = (
        [(f"{prefix}.{head}[{i}]", item) for i, item in enumerate(items)]
        if field.is_repeated
        else [(f"{prefix}.{head}", items)]
    )
    for path, item in pairs:
        if rest:
            yield from _walk(item, rest, path)
        else:
            yield path, item


def references(kind: str, spec: message.Message) -> list[Hit]:
    """Every reference a spec makes, empty names and built-in tools included."""
    return [
        Hit(path, ref.target, name)
        for ref in REFERENCES.get(kind, ())
        for path, name in _walk(spec, ref.path.split("."), "spec")
    ]


def resolvable_without_registry(hit: Hit) -> bool:
    """The built-in file tools resolve without a stored entry (steps and profiles name them
    before any namespace has one)."""
    return hit.target == "tool" and hit.name in BUILTIN_TOOLS


def referring_kinds(target: str) -> list[str]:
    """The kinds whose specs may name an entry of ``target``."""
    return [kind for kind, refs in REFERENCES.items() if any(r.target == target for r in refs)]
