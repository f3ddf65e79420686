"""``Registries``: the entries of every kind, keyed by (namespace, name).

Entries are store records of kind ``registry.<kind>`` (``registry.actor``) named after
the entry, with the serialized entry as body and its labels indexed. Built-in entries
(see ``builtins``) are merged in on every read.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Protocol, TypeVar, cast

from google.protobuf import message

from cleveragents.acp.facade.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.registries.builtins import builtin_entry, builtin_names
from cleveragents.acp.facade.domain.registries.kinds import BY_ENTRY_TYPE, Kind, kind_of
from cleveragents.acp.facade.store.base import Record, Store
from cleveragents.acp.v1 import common_pb2

M = TypeVar("M", bound=message.Message)


class Entry(Protocol):
    """The fields every entry message has, whatever its kind."""

    meta: common_pb2.EntityMeta
    name: str
    description: str
    labels: MutableMapping[str, str]
    revision: int
    spec: message.Message


def view(entry: message.Message) -> Entry:
    return cast(Entry, entry)


def _entry(kind: Kind, record: Record) -> message.Message:
    return kind.entry_type.FromString(record.body)


class Registries:
    def __init__(self, store: Store) -> None:
        self.store = store

    # reads ----------------------------------------------------------------------------

    def find(self, kind: str, namespace: str, name: str) -> message.Message | None:
        """The entry (built-in or stored), or None."""
        k = kind_of(kind)
        builtin = builtin_entry(k.name, namespace, name)
        if builtin is not None:
            return builtin
        record = self.store.get_by_name(k.record_kind, namespace, name)
        return _entry(k, record) if record is not None else None

    def get(self, kind: str, namespace: str, name: str) -> message.Message:
        """The entry, or NOT_FOUND refined as ``<KIND>_NOT_FOUND``."""
        entry = self.find(kind, namespace, name)
        if entry is None:
            k = kind_of(kind)
            raise ACPError(
                ErrorCode.NOT_FOUND,
                f"no {k.label} {name!r} in namespace {namespace!r}",
                {"kind": k.name, "namespace": namespace, "name": name},
                refinement=k.not_found,
            )
        return entry

    def entries(self, kind: str, namespace: str) -> list[message.Message]:
        """Every entry of a kind in one namespace, built-ins included, by name."""
        k = kind_of(kind)
        found = [e for n in builtin_names(k.name) if (e := builtin_entry(k.name, namespace, n)) is not None]
        found.extend(_entry(k, r) for r in self.store.iter_kind(k.record_kind, namespace))
        return sorted(found, key=lambda e: view(e).name)

    def fetch(self, entry_type: type[M], namespace: str, name: str) -> M:
        """``get`` typed by the entry class: ``fetch(registry_pb2.Actor, ns, "scripted")``."""
        return cast(M, self.get(BY_ENTRY_TYPE[entry_type].name, namespace, name))
