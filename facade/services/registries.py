"""The ten registry services, made from one implementation.

Each kind gets a class subclassing its generated ``XServiceServicer`` whose five RPC
methods (``ListActors``, ``GetActor``, ...) are bound from the catalog to the verbs
below, so no per-kind method is written by hand.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from google.protobuf import message

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.facade.domain.registries import KINDS, Kind, Registries, check_name
from cleveragents.acp.v1 import registry_pb2_grpc

Handler = Callable[[Any, Any, object], Awaitable[message.Message]]


class RegistryVerbs:
    """list/show/add/update/remove for one kind, over proto requests."""

    def __init__(self, kind: Kind, registries: Registries) -> None:
        self.kind = kind
        self.registries = registries

    def _respond(self, verb: str, entry: message.Message) -> message.Message:
        return self.kind.operations[verb].response_type(**{self.kind.entry_field: entry})

    async def list(self, request: Any, context: object) -> message.Message:
        ctx = CallContext.of(context)
        entries, token = self.registries.list_page(
            self.kind.name,
            ctx.visible_namespaces(request.namespace),
            labels=dict(request.labels),
            page_size=request.page_size,
            page_token=request.page_token,
        )
        return self.kind.operations["list"].response_type(
            **{self.kind.list_field: entries, "next_page_token": token}
        )

    async def show(self, request: Any, context: object) -> message.Message:
        namespace = CallContext.of(context).namespace(request.namespace)
        check_name(request.name)
        return self._respond("show", self.registries.get(self.kind.name, namespace, request.name))

    async def add(self, request: Any, context: object) -> message.Message:
        namespace = CallContext.of(context).namespace(request.namespace)
        entry = self.registries.add(
            self.kind.name,
            namespace,
            request.name,
            spec=request.spec,
            description=request.description,
            labels=dict(request.labels),
        )
        return self._respond("add", entry)

    async def update(self, request: Any, context: object) -> message.Message:
        namespace = CallContext.of(context).namespace(request.namespace)
        entry = self.registries.update(
            self.kind.name,
            namespace,
            request.name,
            revision=request.revision,
            spec=request.spec if request.HasField("spec") else None,
            description=request.description,
            labels=dict(request.labels),
            mask=list(request.update_mask.paths),
        )
        return self._respond("update", entry)

    async def remove(self, request: Any, context: object) -> message.Message:
        namespace = CallContext.of(context).namespace(request.namespace)
        entry = self.registries.remove(self.kind.name, namespace, request.name, revision=request.revision)
        return self._respond("remove", entry)


def _method(verb: str) -> Handler:
    async def handle(self: Any, request: Any, context: object) -> message.Message:
        verbs: Callable[[Any, object], Awaitable[message.Message]] = getattr(self.verbs, verb)
        return await verbs(request, context)

    handle.__name__ = verb
    return handle


def _servicer_class(kind: Kind) -> type:
    service = kind.operations["list"].service.rsplit(".", 1)[-1]
    base: type = getattr(registry_pb2_grpc, f"{service}Servicer")

    def init(self: Any, registries: Registries) -> None:
        self.verbs = RegistryVerbs(kind, registries)

    namespace: dict[str, Any] = {"__init__": init, "__doc__": f"The {kind.label} registry."}
    namespace.update({op.method: _method(verb) for verb, op in kind.operations.items()})
    return type(f"{service}Facade", (base,), namespace)


SERVICER_CLASSES: tuple[type, ...] = tuple(_servicer_class(kind) for kind in KINDS.values())


def registry_servicers(registries: Registries) -> list[object]:
    """One servicer per registry kind, all over the same ``Registries``."""
    return [cls(registries) for cls in SERVICER_CLASSES]
