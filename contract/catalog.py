"""The operation catalog, built from the proto descriptors at import time.

This is the only operation table in the project: the gateway's routes, the CLI's
commands, the local transport and the docs all read it.

It holds every major version found among the generated packages (``cleveragents.acp.v1``,
a later ``v2``: ``discover``), each a ``Major`` with its own operations, routes prefix, gRPC
package and version table; an operation name may exist in several majors. ``OPERATIONS``
and ``get`` are those of the default major (``versions.DEFAULT_MAJOR``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import itertools
import pkgutil
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType

from google.api import annotations_pb2, http_pb2
from google.protobuf import descriptor, descriptor_pb2, message, message_factory

from cleveragents.acp.contract import surface, versions
from cleveragents.acp.contract.versions import VersionTable
from cleveragents.acp.v1 import options_pb2

NAME_PATTERN = re.compile(r"^[a-z_]+\.[a-z_]+$")
# The label (value "true") of built-in registry entries: the same in every namespace, never
# added, updated or removed; lists may be filtered by it.
BUILTIN_LABEL = "builtin"
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
    # What becomes of a call's work when its caller stops waiting (the proto's
    # ``when_abandoned``; ``abandoned`` says it for every operation).
    when_abandoned: str = ""
    # The major version whose package declares it; its table negotiates the version.
    version_table: VersionTable = versions.V1
    # The kind of the one object the operation mutates (`session`, `plan`) when it takes an
    # expected revision (the proto's ``if_revision``); "" when it refuses one.
    if_revision: str = ""

    @property
    def major(self) -> int:
        return self.version_table.major

    @functools.cached_property
    def key(self) -> str:
        """The operation's name in handler tables: the bare name in major 1 (``plan.status``),
        else qualified by its major (``session.show@v2``)."""
        return self.name if self.version_table.major == 1 else f"{self.name}@v{self.version_table.major}"

    @property
    def abandoned(self) -> str:
        """What becomes of the call's work when its caller stops waiting (a gRPC deadline,
        a dropped HTTP connection): docs/server.md, "Deadlines and disconnects"."""
        if self.read_only:
            return "Nothing changes: the server stops the read."
        return self.when_abandoned or "Made whole or not at all (one store transaction)."

    @property
    def group(self) -> str:
        return self.name.split(".", 1)[0]

    @property
    def verb(self) -> str:
        return self.name.split(".", 1)[1]

    @functools.cached_property
    def full_method(self) -> str:
        """The gRPC wire name, `/cleveragents.acp.v1.PlanService/GetPlanStatus`."""
        return f"/{self.service}/{self.method}"


class CatalogError(Exception):
    """The proto breaks a rule the catalog relies on (a missing option or route)."""


def _http_rule(method: descriptor.MethodDescriptor, table: VersionTable) -> HttpRule:
    options = method.GetOptions()
    if not options.HasExtension(annotations_pb2.http):
        raise CatalogError(f"{method.full_name} has no google.api.http rule")
    rule: http_pb2.HttpRule = options.Extensions[annotations_pb2.http]
    verb = rule.WhichOneof("pattern")
    if verb is None or verb == "custom":
        raise CatalogError(f"{method.full_name} needs a get/put/post/delete/patch http rule")
    path: str = getattr(rule, verb)
    if not path.startswith(f"{table.prefix}/"):
        raise CatalogError(f"{method.full_name}: route {path!r} is not under {table.prefix}/")
    return HttpRule(verb.upper(), path, rule.body, tuple(_PATH_PARAM.findall(path)))


def _operation(method: descriptor.MethodDescriptor, table: VersionTable) -> Operation:
    options = method.GetOptions()
    if not options.HasExtension(options_pb2.operation):
        raise CatalogError(f"{method.full_name} has no (cleveragents.acp.v1.operation) option")
    op: options_pb2.Operation = options.Extensions[options_pb2.operation]
    if not NAME_PATTERN.match(op.name):
        raise CatalogError(f"{method.full_name}: operation name {op.name!r} is not <group>.<verb>")
    if method.client_streaming:
        raise CatalogError(f"{method.full_name}: client streaming is not part of ACP")
    read_only = options.idempotency_level == descriptor_pb2.MethodOptions.NO_SIDE_EFFECTS
    if read_only and op.when_abandoned:
        raise CatalogError(f"{method.full_name}: a read-only operation has nothing to say when_abandoned")
    if read_only and op.if_revision:
        raise CatalogError(f"{method.full_name}: a read-only operation takes no expected revision")
    if op.since not in table.released or versions.newer(op.since, table.current):
        raise CatalogError(
            f"{method.full_name}: since {op.since!r} is not a released version of ACP {table.major}"
        )
    return Operation(
        name=op.name,
        since=op.since,
        summary=op.summary,
        service=method.containing_service.full_name,
        method=method.name,
        request_type=message_factory.GetMessageClass(method.input_type),
        response_type=message_factory.GetMessageClass(method.output_type),
        server_streaming=method.server_streaming,
        http=_http_rule(method, table),
        anonymous=op.anonymous,
        read_only=read_only,
        descriptor=method,
        version_table=table,
        when_abandoned=op.when_abandoned,
        if_revision=op.if_revision,
    )


def _contract_files(package: ModuleType) -> Iterator[descriptor.FileDescriptor]:
    for module_info in pkgutil.iter_modules(package.__path__):
        if module_info.name.endswith("_pb2"):
            module = importlib.import_module(f"{package.__name__}.{module_info.name}")
            yield module.DESCRIPTOR


def build(
    files: Iterable[descriptor.FileDescriptor] | None = None, table: VersionTable = versions.V1
) -> Mapping[str, Operation]:
    """Every RPC of the given files (default: the ACP 1 contract), by operation name;
    ``table`` is the version table of the major they belong to."""
    operations: dict[str, Operation] = {}
    routes: dict[tuple[str, str], str] = {}
    if files is None:
        files = _contract_files(importlib.import_module(versions.V1.package))
    contract_files = list(files)
    problems = surface.check_versions(contract_files, table)
    if problems:
        raise CatalogError("; ".join(problems))
    for file in contract_files:
        for service in file.services_by_name.values():
            for method in service.methods:
                op = _operation(method, table)
                if op.name in operations:
                    raise CatalogError(f"operation {op.name} is declared twice")
                route = (op.http.method, op.http.path)
                if route in routes:
                    raise CatalogError(f"{op.name} and {routes[route]} share the route {route}")
                operations[op.name] = op
                routes[route] = op.name
    return MappingProxyType(dict(sorted(operations.items())))


@dataclass(frozen=True)
class Major:
    """One major version: its proto package's operations and its version table."""

    version_table: VersionTable
    operations: Mapping[str, Operation]

    @property
    def number(self) -> int:
        return self.version_table.major

    @property
    def prefix(self) -> str:
        return self.version_table.prefix

    @property
    def package(self) -> str:
        return self.version_table.package


class Catalog:
    """The operations of every major served side by side."""

    def __init__(self, majors: Iterable[Major]) -> None:
        by_number = {major.number: major for major in majors}
        if not by_number:
            raise CatalogError("the catalog holds no major version")
        self.majors: Mapping[int, Major] = MappingProxyType(dict(sorted(by_number.items())))
        self.default: Major = by_number.get(versions.DEFAULT_MAJOR) or next(iter(self.majors.values()))
        self.by_full_method: Mapping[str, Operation] = MappingProxyType(
            {op.full_method: op for major in self.majors.values() for op in major.operations.values()}
        )

    def served_versions(self) -> list[str]:
        """Every version served, newest first: the newest major first, each newest minor first."""
        return [v for n in sorted(self.majors, reverse=True) for v in self.majors[n].version_table.supported]

    def commands(self) -> list[Operation]:
        """One operation per name across the majors, as a CLI offers them: the default
        major's where it has the name, else that of the newest major that has it."""
        chosen = dict(self.default.operations)
        for number in sorted(self.majors, reverse=True):
            for name, op in self.majors[number].operations.items():
                chosen.setdefault(name, op)
        return list(chosen.values())

    def operations(self) -> Iterator[Operation]:
        """Every operation of every major."""
        for major in self.majors.values():
            yield from major.operations.values()

    def major_for(self, version: str | None) -> Major:
        """The major a client speaking ``version`` calls; the default major when it names
        none, or one this catalog lacks (negotiation then refuses it, listing the supported
        versions)."""
        major = versions.major_of(version, self.default.number)
        return self.majors.get(major, self.default)

    def get(self, name: str, version: str | None = None) -> Operation | None:
        """The operation ``name`` of the major ``version`` names."""
        return self.major_for(version).operations.get(name)


def major(package: ModuleType, table: VersionTable) -> Major:
    """The major of a generated package (``cleveragents.acp.v2``) and its version table."""
    if package.__name__.rsplit(".", 1)[-1] != f"v{table.major}":
        raise CatalogError(f"{package.__name__} is not the package of ACP major {table.major}")
    return Major(table, build(_contract_files(package), table))


def discover(root: str = versions.PACKAGE_ROOT, tables: Mapping[int, VersionTable] | None = None) -> Catalog:
    """Every generated major package under ``root``, each with its table from
    ``contract/versions.py``: no list of majors is kept by hand. Majors are numbered from 1
    without gaps, so ``v1``, ``v2``... are looked up until one is missing (an editable
    install's namespace cannot be listed)."""
    tables = versions.TABLES if tables is None else tables
    found: list[Major] = []
    for number in itertools.count(1):
        name = f"{root}.v{number}"
        if importlib.util.find_spec(name) is None:
            break
        if number not in tables:
            raise CatalogError(f"{name} has no version table in contract/versions.py")
        found.append(major(importlib.import_module(name), tables[number]))
    return Catalog(found)


CATALOG: Catalog = discover()
OPERATIONS: Mapping[str, Operation] = CATALOG.default.operations
BY_FULL_METHOD: Mapping[str, Operation] = CATALOG.by_full_method


def get(name: str) -> Operation | None:
    return OPERATIONS.get(name)
