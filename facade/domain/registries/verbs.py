"""The registry operations of the contract (``<kind>.list|show|add|update|remove``) for
every kind, over proto requests: the kind is read from the request's type, and the
namespace a request names is resolved and authorized on the call's context here, in the
domain, as for every other group."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from google.protobuf import message

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.facade.domain.access import roles
from cleveragents.acp.facade.domain.registries.kinds import KINDS, Kind
from cleveragents.acp.facade.domain.registries.registry import Registries, check_name

# Request class -> the kind whose operation takes it (``ListActorsRequest`` -> actor).
_KIND_OF_REQUEST: Mapping[type[message.Message], Kind] = MappingProxyType(
    {op.request_type: kind for kind in KINDS.values() for op in kind.operations.values()}
)


def _kind(request: message.Message) -> Kind:
    return _KIND_OF_REQUEST[type(request)]


def _respond(kind: Kind, verb: str, entry: message.Message) -> message.Message:
    return kind.operations[verb].response_type(**{kind.entry_field: entry})


class RegistryVerbs:
    """Each verb runs on a store thread in one transaction: reads in one snapshot, writes
    (checks included) on the writer thread, so the event loop never waits for the store."""

    def __init__(self, registries: Registries) -> None:
        self.registries = registries
        self.store = registries.store

    async def list(self, ctx: CallContext, request: Any) -> message.Message:
        return await self.store.read(lambda _store: self._list(ctx, request))

    async def show(self, ctx: CallContext, request: Any) -> message.Message:
        kind = _kind(request)
        namespace = ctx.namespace(request.namespace)
        check_name(request.name)
        return _respond(kind, "show", await self.registries.read_get(kind.name, namespace, request.name))

    async def add(self, ctx: CallContext, request: Any) -> message.Message:
        return await self.store.write(lambda _store: self._add(ctx, request))

    async def update(self, ctx: CallContext, request: Any) -> message.Message:
        return await self.store.write(lambda _store: self._update(ctx, request))

    async def remove(self, ctx: CallContext, request: Any) -> message.Message:
        return await self.store.write(lambda _store: self._remove(ctx, request))

    def _list(self, ctx: CallContext, request: Any) -> message.Message:
        kind = _kind(request)
        namespaces = ctx.visible_namespaces(request.namespace)
        entries, token = self.registries.list_page(kind.name, namespaces, request.labels, request)
        return kind.operations["list"].response_type(**{kind.list_field: entries, "next_page_token": token})

    def _add(self, ctx: CallContext, request: Any) -> message.Message:
        kind = _kind(request)
        namespace = ctx.namespace(request.namespace)
        roles.check_entry(ctx, kind.name, "add", request.spec)
        entry = self.registries.add(
            kind.name,
            namespace,
            request.name,
            spec=request.spec,
            description=request.description,
            labels=dict(request.labels),
        )
        return _respond(kind, "add", entry)

    def _update(self, ctx: CallContext, request: Any) -> message.Message:
        kind = _kind(request)
        namespace = ctx.namespace(request.namespace)
        spec = request.spec if request.HasField("spec") else None
        if spec is not None and (not request.update_mask.paths or "spec" in request.update_mask.paths):
            roles.check_entry(
                ctx, kind.name, "update", spec, self._stored_spec(kind, namespace, request.name)
            )
        entry = self.registries.update(
            kind.name,
            namespace,
            request.name,
            revision=request.revision,
            spec=spec,
            description=request.description,
            labels=dict(request.labels),
            mask=list(request.update_mask.paths),
        )
        return _respond(kind, "update", entry)

    def _remove(self, ctx: CallContext, request: Any) -> message.Message:
        kind = _kind(request)
        namespace = ctx.namespace(request.namespace)
        roles.check_entry(ctx, kind.name, "remove", self._stored_spec(kind, namespace, request.name))
        entry = self.registries.remove(kind.name, namespace, request.name, revision=request.revision)
        return _respond(kind, "remove", entry)

    def _stored_spec(self, kind: Kind, namespace: str, name: str) -> message.Message | None:
        """The spec of the entry as stored (None: none, or a built-in one)."""
        entry: Any = self.registries.find(kind.name, namespace, name) if name else None
        return None if entry is None else entry.spec
