"""The catalog is complete, unique and derived from the descriptors."""

from __future__ import annotations

import re
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

from cleveragents.acp.contract import catalog, versions

REGISTRY_KINDS = (
    "actor",
    "skill",
    "tool",
    "validation",
    "resource",
    "resource_type",
    "project",
    "action",
    "automation_profile",
    "invariant",
)
EXPECTED = (
    [f"session.{v}" for v in ("create", "resume", "list", "show", "delete", "export", "import", "tell")]
    + [
        f"plan.{v}"
        for v in (
            "use",
            "execute",
            "apply",
            "cancel",
            "status",
            "tree",
            "explain",
            "correct",
            "diff",
            "artifacts",
            "prompt",
            "rollback",
            "list",
        )
    ]
    + [f"{k}.{v}" for k in REGISTRY_KINDS for v in ("list", "show", "add", "update", "remove")]
    + [f"context.{v}" for v in ("show", "inspect", "simulate", "set")]
    + ["events.subscribe", "meta.version"]
    # ACP 1.2
    + ["events.ticket"]
    # ACP 1.3
    + ["session.turn", "session.cancel_turn", "session.update", "project.resolve"]
    + ["approval.list", "approval.show", "approval.answer"]
    + [
        f"webhook.{v}"
        for v in ("add", "list", "show", "update", "remove", "rotate_secret", "test", "replay", "deliveries")
    ]
)


def test_every_adr_operation_resolves_exactly_once() -> None:
    assert len(EXPECTED) == 94
    assert sorted(catalog.OPERATIONS) == sorted(EXPECTED)
    methods = [op.full_method for op in catalog.OPERATIONS.values()]
    assert len(methods) == len(set(methods))


@pytest.mark.parametrize("name", EXPECTED)
def test_operation_is_fully_described(name: str) -> None:
    op = catalog.OPERATIONS[name]
    assert re.fullmatch(r"[a-z_]+\.[a-z_]+", op.name)
    assert op.since in versions.RELEASED
    assert op.summary
    assert op.http.method in {"GET", "POST", "PUT", "PATCH", "DELETE"}
    assert op.http.path.startswith("/api/v1/")
    assert op.request_type.DESCRIPTOR.full_name.startswith("cleveragents.acp.v1.")
    assert op.response_type.DESCRIPTOR.full_name.startswith("cleveragents.acp.v1.")
    for param in op.http.path_params:
        assert param in op.request_type.DESCRIPTOR.fields_by_name, (name, param)
    assert op.full_method == f"/{op.service}/{op.method}"
    assert catalog.BY_FULL_METHOD[op.full_method] is op


def test_routes_are_unique() -> None:
    routes = [(op.http.method, op.http.path) for op in catalog.OPERATIONS.values()]
    assert len(routes) == len(set(routes))


def test_version_gating_is_real() -> None:
    assert catalog.OPERATIONS["plan.list"].since == "1.1"
    assert catalog.OPERATIONS["meta.version"].since == "1.1"
    assert catalog.OPERATIONS["plan.status"].since == "1.0"


def test_only_subscribe_streams() -> None:
    streaming = [op.name for op in catalog.OPERATIONS.values() if op.server_streaming]
    assert streaming == ["events.subscribe"]
    assert catalog.OPERATIONS["events.subscribe"].http.path == "/api/v1/events/stream"


def _file(methods: str, extra_messages: str = "") -> descriptor_pb2.FileDescriptorProto:
    """A test-only proto file built in a private pool, to show the catalog's rules."""
    from google.protobuf import text_format

    text = f"""
      name: "test/extra.proto" package: "test.extra" syntax: "proto3"
      dependency: "cleveragents/acp/v1/options.proto" dependency: "google/api/annotations.proto"
      message_type {{ name: "Req" }} message_type {{ name: "Resp" }} {extra_messages}
      service {{ name: "ExtraService" {methods} }}
    """
    return text_format.Parse(text, descriptor_pb2.FileDescriptorProto())


def _pool_with(file: descriptor_pb2.FileDescriptorProto) -> descriptor_pool.DescriptorPool:
    from cleveragents.acp.v1 import options_pb2

    pool = descriptor_pool.DescriptorPool()
    for dep in (options_pb2.DESCRIPTOR.dependencies[0], options_pb2.DESCRIPTOR):
        proto = descriptor_pb2.FileDescriptorProto()
        dep.CopyToProto(proto)
        pool.Add(proto)
    from google.api import annotations_pb2, http_pb2

    for dep in (http_pb2.DESCRIPTOR, annotations_pb2.DESCRIPTOR):
        proto = descriptor_pb2.FileDescriptorProto()
        dep.CopyToProto(proto)
        pool.Add(proto)
    pool.Add(file)
    return pool


def _method(name: str, options: str) -> str:
    return (
        f'method {{ name: "{name}" input_type: ".test.extra.Req" output_type: ".test.extra.Resp" {options} }}'
    )


def _options(op_name: str, route: str) -> str:
    return (
        "options { "
        f'[cleveragents.acp.v1.operation] {{ name: "{op_name}" since: "1.1" summary: "x" }} '
        f'[google.api.http] {{ get: "{route}" }} }}'
    )


def test_a_new_rpc_appears_in_the_catalog_without_other_changes() -> None:
    file = _file(_method("DoThing", _options("extra.thing", "/api/v1/extra")))
    pool = _pool_with(file)
    table = catalog.build(iter([pool.FindFileByName("test/extra.proto")]))
    assert list(table) == ["extra.thing"]
    assert table["extra.thing"].http.path == "/api/v1/extra"


@pytest.mark.parametrize(
    ("methods", "message"),
    [
        (_method("A", ""), "has no (cleveragents.acp.v1.operation) option"),
        (_method("A", _options("Bad-Name", "/api/v1/a")), "is not <group>.<verb>"),
        (_method("A", _options("x.a", "/v2/a")), "is not under /api/v1/"),
        (
            _method("A", _options("x.a", "/api/v1/a")) + _method("B", _options("x.a", "/api/v1/b")),
            "declared twice",
        ),
        (
            _method("A", _options("x.a", "/api/v1/a")) + _method("B", _options("x.b", "/api/v1/a")),
            "share the route",
        ),
        (
            _method(
                "A",
                "options { idempotency_level: NO_SIDE_EFFECTS [cleveragents.acp.v1.operation] "
                '{ name: "x.a" since: "1.1" summary: "x" when_abandoned: "y" } '
                '[google.api.http] { get: "/api/v1/a" } }',
            ),
            "a read-only operation has nothing to say when_abandoned",
        ),
    ],
)
def test_the_catalog_refuses_a_broken_contract(methods: str, message: str) -> None:
    pool = _pool_with(_file(methods))
    with pytest.raises(catalog.CatalogError, match=re.escape(message)):
        catalog.build(iter([pool.FindFileByName("test/extra.proto")]))


READ_VERBS = frozenset(
    {"list", "show", "status", "tree", "explain", "diff", "artifacts", "prompt"}
    | {"inspect", "simulate", "subscribe", "version", "export", "ticket", "turn", "resolve", "deliveries"}
)


def test_read_only_comes_from_the_idempotency_level() -> None:
    """`option idempotency_level = NO_SIDE_EFFECTS` marks exactly the operations that change
    nothing: what the reader role may call (docs/security.md)."""
    read_only = {name for name, op in catalog.OPERATIONS.items() if op.read_only}
    assert read_only == {name for name in EXPECTED if name.split(".")[1] in READ_VERBS}
    for op in catalog.OPERATIONS.values():
        level = op.descriptor.GetOptions().idempotency_level
        assert op.read_only == (level == descriptor_pb2.MethodOptions.NO_SIDE_EFFECTS), op.name


def test_every_get_route_is_read_only() -> None:
    """A GET must not change anything; the read-only POSTs take a body (a prompt, filters)."""
    for op in catalog.OPERATIONS.values():
        if op.http.method == "GET":
            assert op.read_only, op.name
    assert {op.name for op in catalog.OPERATIONS.values() if op.read_only and op.http.method != "GET"} == {
        "context.simulate",
        "events.ticket",
    }


def test_majors_are_discovered_from_the_generated_packages() -> None:
    assert list(catalog.CATALOG.majors) == [1]
    v1 = catalog.CATALOG.majors[1]
    assert v1.prefix == "/api/v1"
    assert v1.package == "cleveragents.acp.v1"
    assert v1.version_table is versions.V1
    assert catalog.OPERATIONS is v1.operations
    assert all(op.major == 1 and op.key == op.name for op in catalog.CATALOG.operations())
    assert all(op.service.startswith("cleveragents.acp.v1.") for op in catalog.CATALOG.operations())


def test_a_major_package_without_a_version_table_is_refused() -> None:
    with pytest.raises(catalog.CatalogError, match=r"cleveragents\.acp\.v1 has no version table"):
        catalog.discover(tables={})


def test_a_version_picks_its_major_and_an_unknown_one_the_default() -> None:
    assert catalog.CATALOG.major_for("1.1").number == 1
    assert catalog.CATALOG.major_for(None).number == 1
    # No major 7 here: the default major answers, and its negotiation refuses 7.0.
    assert catalog.CATALOG.major_for("7.0").number == 1
    assert catalog.CATALOG.major_for("latest").number == 1
    assert catalog.CATALOG.get("plan.status", "1.2") is catalog.OPERATIONS["plan.status"]


@pytest.mark.parametrize(
    ("table", "problem"),
    [
        (dict(major=2, current="1.2", supported=("1.2",), released=("1.2",)), "not a version of major 2"),
        (
            dict(major=1, current="1.2", supported=("1.1", "1.2"), released=("1.1", "1.2")),
            "must start at the current one",
        ),
        (dict(major=1, current="1.2", supported=("1.2",), released=("1.1",)), "must start at the current"),
    ],
)
def test_a_version_table_must_describe_one_major(table: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        versions.VersionTable(**table)
