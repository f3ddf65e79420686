"""Entries every namespace has without anyone adding them, and the built-in tools.

Built-in entries are not stored: they are the same in every namespace, listed and
shown like the others (label ``builtin=true``), and refused on add, update and remove.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, cast

from google.protobuf import message
from ulid import ULID

from cleveragents.acp.contract.catalog import BUILTIN_LABEL
from cleveragents.acp.facade.domain.models.functions import BUILTIN as FILE_TOOLS
from cleveragents.acp.facade.domain.registries.kinds import KINDS
from cleveragents.acp.v1 import common_pb2, specs_pb2

# The file tools working on a plan's staged artifacts (defined, with what they do and their
# parameters, where a model is offered them); steps and automation profiles may name them
# without registering anything, and ``tool.list`` shows them as built-ins.
BUILTIN_TOOLS: frozenset[str] = frozenset(FILE_TOOLS)


@dataclass(frozen=True)
class Builtin:
    description: str
    spec: message.Message


BUILTINS: Mapping[tuple[str, str], Builtin] = MappingProxyType(
    {
        ("actor", "orchestrator"): Builtin(
            "The deterministic built-in session orchestrator.",
            specs_pb2.ActorSpec(provider="orchestrator"),
        ),
        ("actor", "scripted"): Builtin(
            "Deterministic: runs the action's declared steps; needs nothing external.",
            specs_pb2.ActorSpec(provider="scripted"),
        ),
        ("resource_type", "directory"): Builtin(
            "A folder on the server's disk.",
            specs_pb2.ResourceTypeSpec(driver="directory"),
        ),
        **{("tool", name): Builtin(tool[0], specs_pb2.ToolSpec()) for name, tool in FILE_TOOLS.items()},
    }
)


def builtin_id(kind: str, namespace: str, name: str) -> str:
    """A stable ULID (time zero) per namespace, so a built-in looks the same on every read."""
    digest = hashlib.sha256(f"{kind}/{namespace}/{name}".encode()).digest()
    return str(ULID.from_bytes(bytes(6) + digest[:10]))


def builtin_entry(kind: str, namespace: str, name: str) -> message.Message | None:
    builtin = BUILTINS.get((kind, name))
    if builtin is None:
        return None
    entry: Any = KINDS[kind].entry_type(
        meta=common_pb2.EntityMeta(id=builtin_id(kind, namespace, name), namespace=namespace),
        name=name,
        description=builtin.description,
        labels={BUILTIN_LABEL: "true"},
        revision=1,
    )
    entry.spec.CopyFrom(builtin.spec)
    return cast(message.Message, entry)


def builtin_names(kind: str) -> list[str]:
    return sorted(name for k, name in BUILTINS if k == kind)


def is_builtin(kind: str, name: str) -> bool:
    return (kind, name) in BUILTINS
