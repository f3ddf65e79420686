"""``Registries``: the entries of every kind, keyed by (namespace, name).

Entries are store records of kind ``registry.<kind>`` (``registry.actor``) named after
the entry, with the serialized entry as body and its labels indexed. Built-in entries
(see ``builtins``) are merged in on every read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from functools import partial
from typing import Any, Protocol, TypeVar, cast

from google.protobuf import message
from google.protobuf.timestamp_pb2 import Timestamp
from ulid import ULID

from cleveragents.acp.contract import limits
from cleveragents.acp.contract.call import DEFAULT_NAMESPACE
from cleveragents.acp.contract.catalog import BUILTIN_LABEL
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain import paging
from cleveragents.acp.facade.domain.access.policy import Policy
from cleveragents.acp.facade.domain.registries.builtins import (
    builtin_entry,
    builtin_names,
    is_builtin,
)
from cleveragents.acp.facade.domain.registries.kinds import BY_ENTRY_TYPE, KINDS, Kind, kind_of
from cleveragents.acp.facade.domain.registries.references import (
    references,
    referring_kinds,
    resolvable_without_registry,
)
from cleveragents.acp.facade.domain.registries.specs import check_spec, invalid
from cleveragents.acp.facade.store.base import (
    ListQuery,
    Record,
    StaleRevisionError,
    Store,
    StoreConflictError,
)
from cleveragents.acp.v1 import common_pb2, specs_pb2

M = TypeVar("M", bound=message.Message)
ReferrerSource = Callable[[str, str, str], Iterable[str]]

DIRECTORY_DRIVER = "directory"
# Dots allow tool names in the style of `fs.read`.
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")
LABEL_KEY = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._/-]{{0,{limits.MAX_MAP_KEY_CHARS - 1}}}")
MAX_LABEL_VALUE = limits.MAX_MAP_VALUE_CHARS
MAX_DESCRIPTION = 4096
MASKABLE = frozenset({"description", "labels", "spec"})


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
    def __init__(self, store: Store, policy: Policy | None = None) -> None:
        self.store = store
        # The operator's resource roots and command settings, read by plans and context too.
        self.policy = policy if policy is not None else Policy.local()
        self._pages = paging.Pager(store)
        self._referrer_sources: list[ReferrerSource] = []

    def add_referrer_source(self, source: ReferrerSource) -> None:
        """Let entities outside the registries (sessions naming an actor, plans naming an
        action or project) block a remove: ``source(kind, namespace, name)`` returns
        referrers such as ``session/01J...``."""
        self._referrer_sources.append(source)

    # reads ----------------------------------------------------------------------------

    def find(self, kind: str, namespace: str, name: str) -> message.Message | None:
        """The entry (built-in or stored), or None."""
        k = kind_of(kind)
        builtin = builtin_entry(k.name, namespace, name)
        if builtin is not None:
            return builtin
        record = self.store.get_by_name(k.record_kind, namespace, name)
        return _entry(k, record) if record is not None else None

    async def read_get(self, kind: str, namespace: str, name: str) -> message.Message:
        """``get`` in a read of its own, which the store may answer without a thread."""
        k = kind_of(kind)
        entry = builtin_entry(k.name, namespace, name)
        if entry is None:
            record = await self.store.read_get_by_name(k.record_kind, namespace, name)
            entry = _entry(k, record) if record is not None else None
        if entry is None:
            raise _not_found(k, namespace, name)
        return entry

    def exists(self, kind: str, namespace: str, name: str) -> bool:
        """Whether ``find`` would find it, without building the entry: a built-in always
        exists (none can be added or removed) and asks nothing of the store."""
        k = kind_of(kind)
        return is_builtin(k.name, name) or self.store.get_by_name(k.record_kind, namespace, name) is not None

    def get(self, kind: str, namespace: str, name: str) -> message.Message:
        """The entry, or NOT_FOUND refined as ``<KIND>_NOT_FOUND``."""
        entry = self.find(kind, namespace, name)
        if entry is None:
            raise _not_found(kind_of(kind), namespace, name)
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

    def is_directory(self, namespace: str, spec: specs_pb2.ResourceSpec) -> bool:
        """Whether a resource spec names a type of the ``directory`` driver."""
        resource_type: Any = self.find("resource_type", namespace, spec.type)
        return resource_type is not None and resource_type.spec.driver == DIRECTORY_DRIVER

    def referrers(self, kind: str, namespace: str, name: str) -> list[str]:
        """What names this entry in its namespace (``action/deploy``), sorted."""
        found = set()
        for referring in referring_kinds(kind_of(kind).name):
            for record in self.store.iter_kind(KINDS[referring].record_kind, namespace):
                entry = view(_entry(KINDS[referring], record))
                if any(h.target == kind and h.name == name for h in references(referring, entry.spec)):
                    found.add(f"{referring}/{entry.name}")
        for source in self._referrer_sources:
            found.update(source(kind, namespace, name))
        return sorted(found)

    def list_page(
        self,
        kind: str,
        namespaces: frozenset[str] | None,
        labels: Mapping[str, str],
        request: paging.PagedRequest,
    ) -> tuple[list[message.Message], str]:
        """One page of entries, ordered by (namespace, name), carrying all ``labels``.

        ``namespaces=None`` lists every namespace; built-ins then appear in ``default``
        and in each namespace that holds an entry of this kind. The store reads the page
        from its name index (O(page) however many entries there are); the few built-ins
        are merged in."""
        k = kind_of(kind)
        wanted = dict(labels)
        filters = {"namespaces": sorted(namespaces) if namespaces is not None else None, "labels": wanted}

        def fetch(position: str | None, limit: int) -> list[message.Message]:
            after = _position(position)
            if namespaces is None and wanted and _builtin_may_match(wanted):
                return self._scan_page(k, wanted, after, limit)
            query = ListQuery(
                k.record_kind, namespaces, labels=wanted, by_name=True, after_name=after, limit=limit
            )
            found = [_entry(k, r) for r in self.store.query(query)]
            if namespaces is None:
                # Past the cursor, the namespaces holding entries are those this page reads
                # (a full page ends before any other's built-ins would sort).
                shown = {DEFAULT_NAMESPACE} | {view(e).meta.namespace for e in found}
                if after is not None:
                    shown.add(after[0])
            else:
                shown = set(namespaces)
            found.extend(_builtins(k, shown, wanted))
            keyed = sorted((_key(e), e) for e in found if after is None or _key(e) > after)
            return [e for _, e in keyed][:limit]

        return self._pages.page(k.record_kind, filters, request, fetch, lambda e: json.dumps(list(_key(e))))

    def _scan_page(
        self, k: Kind, wanted: Mapping[str, str], after: tuple[str, str] | None, limit: int
    ) -> list[message.Message]:
        """Every namespace with a label filter built-ins carry: built-ins show in each
        namespace holding an entry of the kind, matching or not, so the kind is read whole."""
        records = list(self.store.iter_kind(k.record_kind))
        shown = {DEFAULT_NAMESPACE} | {r.namespace for r in records}
        found = [e for e in map(partial(_entry, k), records) if _labelled(e, wanted)]
        found.extend(_builtins(k, shown, wanted))
        keyed = sorted((_key(e), e) for e in found if after is None or _key(e) > after)
        return [e for _, e in keyed][:limit]

    # writes ---------------------------------------------------------------------------

    def add(
        self,
        kind: str,
        namespace: str,
        name: str,
        *,
        spec: message.Message,
        description: str = "",
        labels: Mapping[str, str] | None = None,
    ) -> message.Message:
        k = kind_of(kind)
        check_name(name)
        _check_description(description)
        _check_labels(labels or {})
        if is_builtin(k.name, name):
            raise _exists(k, namespace, name, builtin=True)
        with self.store.transaction():
            if self.store.get_by_name(k.record_kind, namespace, name) is not None:
                raise _exists(k, namespace, name)
            checked = self._checked_spec(k, namespace, spec)
            now = Timestamp()
            now.GetCurrentTime()
            entry: Any = k.entry_type(
                meta=common_pb2.EntityMeta(
                    id=str(ULID()), namespace=namespace, create_time=now, update_time=now
                ),
                name=name,
                description=description,
                labels=dict(labels or {}),
                revision=1,
            )
            entry.spec.CopyFrom(checked)
            try:
                self.store.insert(_record(k, entry))
            except StoreConflictError:
                raise _exists(k, namespace, name) from None
        return cast(message.Message, entry)

    def update(
        self,
        kind: str,
        namespace: str,
        name: str,
        *,
        revision: int,
        spec: message.Message | None = None,
        description: str = "",
        labels: Mapping[str, str] | None = None,
        mask: Sequence[str] = (),
    ) -> message.Message:
        """Replace the fields in ``mask`` (all of ``description``, ``labels``, ``spec``
        when empty) of the entry at ``revision``; a stale revision is INVALID_STATE."""
        k = kind_of(kind)
        check_name(name)
        fields = _mask(mask)
        if "description" in fields:
            _check_description(description)
        if "labels" in fields:
            _check_labels(labels or {})
        self._refuse_builtin(k, namespace, name, "updated")
        with self.store.transaction():
            record = self._record(k, namespace, name)
            _check_revision(k, record, revision)
            entry: Any = _entry(k, record)
            if "description" in fields:
                entry.description = description
            if "labels" in fields:
                entry.labels.clear()
                entry.labels.update(labels or {})
            if "spec" in fields:
                entry.spec.CopyFrom(self._checked_spec(k, namespace, spec or k.spec_type()))
            entry.revision = record.revision + 1
            entry.meta.update_time.GetCurrentTime()
            try:
                self.store.update(_record(k, entry), expected_revision=record.revision)
            except StaleRevisionError as exc:
                raise _stale(k, name, revision, exc.current) from None
        return cast(message.Message, entry)

    def remove(self, kind: str, namespace: str, name: str, *, revision: int = 0) -> message.Message:
        """Remove an entry nothing refers to; ``revision`` (when not 0) must be current."""
        k = kind_of(kind)
        check_name(name)
        self._refuse_builtin(k, namespace, name, "removed")
        with self.store.transaction():
            record = self._record(k, namespace, name)
            if revision:
                _check_revision(k, record, revision)
            referrers = self.referrers(k.name, namespace, name)
            if referrers:
                raise ACPError(
                    ErrorCode.INVALID_STATE,
                    f"{k.label} {name!r} is still referred to by {', '.join(referrers)}",
                    {"kind": k.name, "namespace": namespace, "name": name, "referrers": referrers},
                )
            self.store.delete(k.record_kind, record.id)
        return _entry(k, record)

    # helpers --------------------------------------------------------------------------

    def _record(self, k: Kind, namespace: str, name: str) -> Record:
        record = self.store.get_by_name(k.record_kind, namespace, name)
        if record is None:
            raise _not_found(k, namespace, name)
        return record

    def _refuse_builtin(self, k: Kind, namespace: str, name: str, verb: str) -> None:
        if is_builtin(k.name, name):
            raise ACPError(
                ErrorCode.INVALID_STATE,
                f"{k.label} {name!r} is built in and cannot be {verb}",
                {"kind": k.name, "namespace": namespace, "name": name, "builtin": True},
            )

    def _checked_spec(self, k: Kind, namespace: str, spec: message.Message) -> message.Message:
        """A validated copy of ``spec`` with defaults filled; references must exist."""
        if not isinstance(spec, k.spec_type):
            raise invalid("spec", f"a {k.label} takes a {k.spec_type.DESCRIPTOR.name}")
        checked = k.spec_type()
        checked.CopyFrom(spec)
        check_spec(k.name, checked, lambda target, name: self.find(target, namespace, name))
        if isinstance(checked, specs_pb2.ResourceSpec) and self.is_directory(namespace, checked):
            self.policy.check_folder(namespace, checked.path, "spec.path")
        if isinstance(checked, specs_pb2.ActorSpec):
            self.policy.check_model_actor(checked.base_url, checked.api_key_env)
        seen: set[tuple[str, str]] = set()
        for hit in references(k.name, checked):
            listed = hit.field.endswith("]")
            if not hit.name:
                if listed:
                    raise invalid(hit.field, f"must name a {KINDS[hit.target].label}")
                continue
            if listed:
                key = (hit.field.rsplit("[", 1)[0], hit.name)
                if key in seen:
                    raise invalid(hit.field, f"{hit.name!r} is listed twice")
                seen.add(key)
            if not resolvable_without_registry(hit) and self.find(hit.target, namespace, hit.name) is None:
                raise invalid(
                    hit.field,
                    f"names a missing {KINDS[hit.target].label} {hit.name!r}",
                    missing=f"{hit.target}/{hit.name}",
                    namespace=namespace,
                )
        return checked


def _record(k: Kind, entry: Any) -> Record:
    return Record(
        kind=k.record_kind,
        id=entry.meta.id,
        namespace=entry.meta.namespace,
        name=entry.name,
        revision=entry.revision,
        labels=dict(entry.labels),
        create_time=entry.meta.create_time.ToNanoseconds() / 1e9,
        update_time=entry.meta.update_time.ToNanoseconds() / 1e9,
        body=entry.SerializeToString(deterministic=True),
    )


def _labelled(entry: message.Message, wanted: Mapping[str, str]) -> bool:
    return all(view(entry).labels.get(key) == value for key, value in wanted.items())


def _builtin_may_match(wanted: Mapping[str, str]) -> bool:
    return all(key == BUILTIN_LABEL and value == "true" for key, value in wanted.items())


def _builtins(k: Kind, namespaces: Iterable[str], wanted: Mapping[str, str]) -> list[message.Message]:
    found = [
        e
        for ns in namespaces
        for n in builtin_names(k.name)
        if (e := builtin_entry(k.name, ns, n)) is not None
    ]
    return [e for e in found if _labelled(e, wanted)]


def _key(entry: message.Message) -> tuple[str, str]:
    """Where an entry sits in a list: (namespace, name)."""
    return (view(entry).meta.namespace, view(entry).name)


def _position(position: str | None) -> tuple[str, str] | None:
    if position is None:
        return None
    value = json.loads(position)
    return (str(value[0]), str(value[1]))


def check_name(name: str) -> None:
    if not NAME.fullmatch(name):
        raise invalid("name", f"{name!r} is not a name: 1-63 of a-z 0-9 . _ -, starting a-z or 0-9")


def _check_description(description: str) -> None:
    if len(description) > MAX_DESCRIPTION:
        raise invalid("description", f"must be at most {MAX_DESCRIPTION} characters")


def _check_labels(labels: Mapping[str, str]) -> None:
    for key, value in labels.items():
        if not LABEL_KEY.fullmatch(key):
            raise invalid(f"labels.{key}", "label keys are 1-63 of letters, digits, '.', '_', '-', '/'")
        if key == BUILTIN_LABEL:
            raise invalid(f"labels.{key}", "the builtin label is reserved for built-in entries")
        if len(value) > MAX_LABEL_VALUE:
            raise invalid(f"labels.{key}", f"label values are at most {MAX_LABEL_VALUE} characters")


def _mask(paths: Sequence[str]) -> frozenset[str]:
    unknown = sorted(set(paths) - MASKABLE)
    if unknown:
        raise invalid(
            "update_mask", f"unknown path {unknown[0]!r}; use {', '.join(sorted(MASKABLE))}", paths=unknown
        )
    return frozenset(paths) or MASKABLE


def _check_revision(k: Kind, record: Record, revision: int) -> None:
    if record.revision != revision:
        raise _stale(k, record.name or "", revision, record.revision)


def _stale(k: Kind, name: str, revision: int, current: int) -> ACPError:
    return ACPError(
        ErrorCode.INVALID_STATE,
        f"{k.label} {name!r} is at revision {current}, not {revision}: read it again",
        {
            "kind": k.name,
            "name": name,
            "field": "revision",
            "revision": revision,
            "current_revision": current,
        },
    )


def _not_found(k: Kind, namespace: str, name: str) -> ACPError:
    return ACPError(
        ErrorCode.NOT_FOUND,
        f"no {k.label} {name!r} in namespace {namespace!r}",
        {"kind": k.name, "namespace": namespace, "name": name},
        refinement=k.not_found,
    )


def _exists(k: Kind, namespace: str, name: str, *, builtin: bool = False) -> ACPError:
    what = "a built-in" if builtin else "an existing"
    return ACPError(
        ErrorCode.ALREADY_EXISTS,
        f"{name!r} is {what} {k.label} in namespace {namespace!r}",
        {"kind": k.name, "namespace": namespace, "name": name},
        refinement=f"{k.name.upper()}_ALREADY_EXISTS",
    )
