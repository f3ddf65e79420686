"""The registry kinds, read from the contract: no second list of operations.

Every service of ``registry.proto`` is one kind; its operation group (``actor``,
``resource_type``) is the kind's name, its ``show`` response names the entry message,
the entry's ``spec`` field the spec message, and the ``list`` response the list field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import cast

from google.protobuf import descriptor, message, message_factory

from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.v1 import registry_pb2

VERBS = ("list", "show", "add", "update", "remove")


@dataclass(frozen=True)
class Kind:
    name: str
    entry_type: type[message.Message]
    spec_type: type[message.Message]
    # The repeated field of the list response (``actors``) and the entry field of the
    # other responses (``actor``).
    list_field: str
    entry_field: str
    operations: Mapping[str, Operation]

    @property
    def record_kind(self) -> str:
        """The store record kind of this registry's entries."""
        return f"registry.{self.name}"

    @property
    def label(self) -> str:
        """How messages name the kind: ``automation profile``."""
        return self.name.replace("_", " ")

    @property
    def not_found(self) -> str:
        """The NOT_FOUND refinement: ``ACTOR_NOT_FOUND``."""
        return f"{self.name.upper()}_NOT_FOUND"


def _message_field(cls: type[message.Message], *, repeated: bool) -> descriptor.FieldDescriptor:
    """The one (repeated or singular) message field of ``cls``."""
    desc = cast(descriptor.Descriptor, cls.DESCRIPTOR)
    fields = [f for f in desc.fields if f.message_type is not None and f.is_repeated == repeated]
    if len(fields) != 1:
        raise catalog.CatalogError(f"{desc.full_name} must hold exactly one entry field")
    return fields[0]


def _kind(group: str, operations: Mapping[str, Operation]) -> Kind:
    if set(operations) != set(VERBS):
        raise catalog.CatalogError(f"registry {group} must have the verbs {', '.join(VERBS)}")
    shown = _message_field(operations["show"].response_type, repeated=False)
    listed = _message_field(operations["list"].response_type, repeated=True)
    entry = shown.message_type
    spec = entry.fields_by_name["spec"].message_type if entry is not None else None
    if entry is None or spec is None or listed.message_type is not entry:
        raise catalog.CatalogError(f"registry {group}: entries need a spec and one entry type")
    return Kind(
        name=group,
        entry_type=message_factory.GetMessageClass(entry),
        spec_type=message_factory.GetMessageClass(spec),
        list_field=listed.name,
        entry_field=shown.name,
        operations=MappingProxyType(dict(operations)),
    )


def _build() -> Mapping[str, Kind]:
    groups: dict[str, dict[str, Operation]] = {}
    for op in catalog.OPERATIONS.values():
        if op.descriptor.containing_service.file.name == registry_pb2.DESCRIPTOR.name:
            groups.setdefault(op.group, {})[op.verb] = op
    return MappingProxyType({group: _kind(group, ops) for group, ops in sorted(groups.items())})


KINDS: Mapping[str, Kind] = _build()
BY_ENTRY_TYPE: Mapping[type[message.Message], Kind] = MappingProxyType(
    {kind.entry_type: kind for kind in KINDS.values()}
)
BY_SERVICE: Mapping[str, Kind] = MappingProxyType(
    {op.service: kind for kind in KINDS.values() for op in kind.operations.values()}
)


def kind_of(name: str) -> Kind:
    kind = KINDS.get(name)
    if kind is None:
        raise ACPError(ErrorCode.INVALID_PARAMS, f"{name!r} is not a registry kind", {"kind": name})
    return kind
