"""The operation catalog, built from the proto descriptors at import time.

This is the only operation table in the project: the gateway's routes, the CLI's
commands, the local transport and the docs all read it.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from google.api import annotations_pb2, http_pb2
from google.protobuf import descriptor, descriptor_pb2, message, message_factory

import cleveragents.acp.v1 as acp_v1
from cleveragents.acp.contract import surface, versions
from cleveragents.acp.v1 import options_pb2

NAME_PATTERN = re.compile(r"^[a-z_]+\.[a-z_]+$")
_PATH_PARAM = re.compile(r"\{([a-z_][a-z0-9_.]*)(?:=[^}]*)?\}")


@dataclass(frozen=True)
class HttpRule:
    """A `google.api.http` rule: verb, path template and which fields come from the body."""

    method: str
    path: str
    body: str
    path_params: tuple[str, ...]


@dataclass(frozen=True)
class Operation:
    name: str
    since: str
    summary: str
    service: str
    method: str
    request_type: type[message.Message]
    response_type: type[message.Message]
    server_streaming: bool
    http: HttpRule
    anonymous: bool
    # `option idempotency_level = NO_SIDE_EFFECTS` in the proto: the call changes nothing a
    # client can see, so a reader role may make it (docs/security.md).
    read_only: bool
    descriptor: descriptor.MethodDescriptor = field(repr=False, compare=False)

    @property
    def group(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def verb(self) -> str:
        return self.name.split(".", 1)[1]

    @property
    def full_method(self) -> str:
        """The gRPC wire name, `/cleveragents.acp.v1.PlanService/GetPlanStatus`."""
        return f"/{self.service}/{self.method}"


class CatalogError(Exception):
    """The proto breaks a rule the catalog relies on (a missing option or route)."""


def _http_rule(method: descriptor.MethodDescriptor) -> HttpRule:
    options = method.GetOptions()
    if not options.HasExtension(annotations_pb2.http):
        raise CatalogError(f"{method.full_name} has no google.api.http rule")
    rule: http_pb2.HttpRule = options.Extensions[annotations_pb2.http]
    verb = rule.WhichOneof("pattern")
    if verb is None or verb == "custom":
        raise CatalogError(f"{method.full_name} needs a get/put/post/delete/patch http rule")
    path: str = getattr(rule, verb)
    if not path.startswith("/api/v1/"):
        raise CatalogError(f"{method.full_name}: route {path!r} is not under /api/v1/")
    return HttpRule(verb.upper(), path, rule.body, tuple(_PATH_PARAM.findall(path)))


def _operation(method: descriptor.MethodDescriptor) -> Operation:
    options = method.GetOptions()
    if not options.HasExtension(options_pb2.operation):
        raise CatalogError(f"{method.full_name} has no (cleveragents.acp.v1.operation) option")
    op: options_pb2.Operation = options.Extensions[options_pb2.operation]
    if not NAME_PATTERN.match(op.name):
        raise CatalogError(f"{method.full_name}: operation name {op.name!r} is not <group>.<verb>")
    if method.client_streaming:
        raise CatalogError(f"{method.full_name}: client streaming is not part of ACP")
    if op.since not in versions.RELEASED or versions.newer(op.since, versions.CURRENT):
        raise CatalogError(f"{method.full_name}: since {op.since!r} is not a released ACP version")
    return Operation(
        name=op.name,
        since=op.since,
        summary=op.summary,
        service=method.containing_service.full_name,
        method=method.name,
        request_type=message_factory.GetMessageClass(method.input_type),
        response_type=message_factory.GetMessageClass(method.output_type),
        server_streaming=method.server_streaming,
        http=_http_rule(method),
        anonymous=op.anonymous,
        read_only=options.idempotency_level == descriptor_pb2.MethodOptions.NO_SIDE_EFFECTS,
        descriptor=method,
    )


def _contract_files() -> Iterator[descriptor.FileDescriptor]:
    for module_info in pkgutil.iter_modules(acp_v1.__path__):
        if module_info.name.endswith("_pb2"):
            module = importlib.import_module(f"{acp_v1.__name__}.{module_info.name}")
            yield module.DESCRIPTOR


def build(files: Iterator[descriptor.FileDescriptor] | None = None) -> Mapping[str, Operation]:
    """Every RPC of the given files (default: the ACP contract), by operation name."""
    table: dict[str, Operation] = {}
    routes: dict[tuple[str, str], str] = {}
    contract_files = list(files if files is not None else _contract_files())
    problems = surface.check_versions(contract_files)
    if problems:
        raise CatalogError("; ".join(problems))
    for file in contract_files:
        for service in file.services_by_name.values():
            for method in service.methods:
                op = _operation(method)
                if op.name in table:
                    raise CatalogError(f"operation {op.name} is declared twice")
                route = (op.http.method, op.http.path)
                if route in routes:
                    raise CatalogError(f"{op.name} and {routes[route]} share the route {route}")
                table[op.name] = op
                routes[route] = op.name
    return MappingProxyType(dict(sorted(table.items())))


OPERATIONS: Mapping[str, Operation] = build()
BY_FULL_METHOD: Mapping[str, Operation] = MappingProxyType({op.full_method: op for op in OPERATIONS.values()})


def get(name: str) -> Operation | None:
    return OPERATIONS.get(name)
