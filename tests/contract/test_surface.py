"""The surface a client of an older minor sees: newer fields cleared in what it receives and
refused in what it sends, newer event types never delivered; the `(since)` values checked."""

from __future__ import annotations

import re
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, text_format

from cleveragents.acp.contract import catalog, surface, versions
from cleveragents.acp.contract.errors import ACPError

PRIOR = versions.SUPPORTED[-1]
SINCE = "[cleveragents.acp.v1.since]"

_FILE = f"""
  name: "test/surface.proto" package: "test.surface" syntax: "proto3"
  dependency: "cleveragents/acp/v1/options.proto"
  message_type {{
    name: "Inner"
    field {{ name: "old" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }}
    field {{ name: "fresh" number: 2 type: TYPE_STRING label: LABEL_OPTIONAL options {{ {SINCE}: "1.2" }} }}
  }}
  message_type {{
    name: "Outer"
    field {{ name: "name" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }}
    field {{ name: "one" number: 2 type: TYPE_MESSAGE type_name: ".test.surface.Inner"
      label: LABEL_OPTIONAL }}
    field {{ name: "many" number: 3 type: TYPE_MESSAGE type_name: ".test.surface.Inner"
      label: LABEL_REPEATED }}
    field {{
      name: "by_key" number: 4 type: TYPE_MESSAGE type_name: ".test.surface.Outer.ByKeyEntry"
      label: LABEL_REPEATED
    }}
    field {{
      name: "later" number: 5 type: TYPE_MESSAGE type_name: ".test.surface.Inner" label: LABEL_OPTIONAL
      options {{ {SINCE}: "1.2" }}
    }}
    nested_type {{
      name: "ByKeyEntry" options {{ map_entry: true }}
      field {{ name: "key" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }}
      field {{ name: "value" number: 2 type: TYPE_MESSAGE type_name: ".test.surface.Inner"
      label: LABEL_OPTIONAL }}
    }}
  }}
  message_type {{
    name: "Plain"
    field {{ name: "a" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }}
    field {{ name: "self" number: 2 type: TYPE_MESSAGE type_name: ".test.surface.Plain"
      label: LABEL_OPTIONAL }}
  }}
"""


def _pool(text: str = _FILE) -> descriptor_pool.DescriptorPool:
    from cleveragents.acp.v1 import options_pb2

    pool = descriptor_pool.DescriptorPool()
    for dep in (options_pb2.DESCRIPTOR.dependencies[0], options_pb2.DESCRIPTOR):
        proto = descriptor_pb2.FileDescriptorProto()
        dep.CopyToProto(proto)
        pool.Add(proto)
    pool.Add(text_format.Parse(text, descriptor_pb2.FileDescriptorProto()))
    return pool


POOL = _pool()


def cls(name: str) -> Any:
    return message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"test.surface.{name}"))


def outer() -> Any:
    msg = cls("Outer")(name="n")
    msg.one.old, msg.one.fresh = "o", "f"
    for i in range(2):
        item = msg.many.add()
        item.old, item.fresh = f"o{i}", f"f{i}"
    msg.by_key["k"].old = "ko"
    msg.by_key["k"].fresh = "kf"
    msg.later.old = "lo"
    return msg


def test_the_current_version_sees_everything_and_pays_no_copy() -> None:
    msg = outer()
    assert surface.strip(msg, versions.CURRENT) is msg
    surface.check_request(msg, versions.CURRENT)


def test_an_older_client_gets_a_copy_without_the_newer_fields_at_any_depth() -> None:
    msg = outer()
    seen: Any = surface.strip(msg, PRIOR)
    assert seen is not msg
    assert (seen.name, seen.one.old, seen.one.fresh) == ("n", "o", "")
    assert [(i.old, i.fresh) for i in seen.many] == [("o0", ""), ("o1", "")]
    assert (seen.by_key["k"].old, seen.by_key["k"].fresh) == ("ko", "")
    assert not seen.HasField("later")
    # The original is untouched: it may be shared with clients of the current version.
    assert msg == outer()


def test_a_type_that_cannot_hold_newer_fields_is_passed_through_even_when_recursive() -> None:
    plain = cls("Plain")(a="x")
    plain.self.a = "y"
    assert surface.strip(plain, PRIOR) is plain
    assert not surface.holds_newer(plain.DESCRIPTOR, PRIOR)
    assert surface.holds_newer(cls("Outer").DESCRIPTOR, PRIOR)


@pytest.mark.parametrize(
    ("build", "where"),
    [
        (lambda m: setattr(m.one, "fresh", "x"), "one.fresh"),
        (lambda m: setattr(m.many.add(), "fresh", "x"), "many[0].fresh"),
        (lambda m: setattr(m.by_key["a"], "fresh", "x"), "by_key[a].fresh"),
        (lambda m: setattr(m.later, "old", "x"), "later"),
    ],
)
def test_an_older_client_may_not_send_a_newer_field(build: Any, where: str) -> None:
    msg = cls("Outer")(name="n")
    build(msg)
    with pytest.raises(ACPError) as info:
        surface.check_request(msg, PRIOR)
    assert info.value.code == "VERSION_MISMATCH"
    assert info.value.details["field"] == where
    assert info.value.details["since"] == "1.2"
    assert info.value.details["supported_versions"] == list(versions.SUPPORTED)
    surface.check_request(msg, versions.CURRENT)


def test_a_request_with_only_old_fields_passes_at_the_prior_version() -> None:
    msg = cls("Outer")(name="n")
    msg.one.old = "o"
    msg.many.add().old = "x"
    surface.check_request(msg, PRIOR)


def test_event_types_by_version() -> None:
    table = {"plan.created": "1.0", "model.delta": "1.2"}
    assert surface.event_types(PRIOR, [], table) == ["plan.created"]
    assert surface.event_types(versions.CURRENT, [], table) == []
    assert surface.event_types(PRIOR, ["plan.created"], table) == ["plan.created"]
    with pytest.raises(ACPError) as info:
        surface.event_types(PRIOR, ["model.delta"], table)
    assert info.value.code == "VERSION_MISMATCH"
    assert info.value.details["event_type"] == "model.delta"
    # Names it does not know are the event log's to refuse, with the list of valid types.
    assert surface.event_types(PRIOR, ["bogus"], table) == ["bogus"]


def test_every_event_type_of_the_contract_is_dated() -> None:
    assert set(surface.EVENT_TYPE_SINCE.values()) <= set(versions.RELEASED)
    assert surface.EVENT_TYPE_SINCE["plan.created"] == "1.0"


@pytest.mark.parametrize("since", ["1.4", "2.0", "banana", "1.02"])
def test_the_catalog_refuses_a_field_of_an_unreleased_version(since: str) -> None:
    bad = _FILE.replace(f'{SINCE}: "1.2"', f'{SINCE}: "{since}"', 1)
    pool = _pool(bad)
    with pytest.raises(catalog.CatalogError, match=re.escape(f"(since) {since!r}")):
        catalog.build(iter([pool.FindFileByName("test/surface.proto")]))


def test_the_contract_dates_every_operation_with_a_released_version() -> None:
    for op in catalog.OPERATIONS.values():
        assert op.since in versions.RELEASED, op.name
        assert not versions.newer(op.since, versions.CURRENT), op.name


@pytest.mark.parametrize("text", ["1.2", "0.0", "10.25"])
def test_versions_parse(text: str) -> None:
    assert versions.parse(text) == tuple(int(p) for p in text.split("."))


@pytest.mark.parametrize("text", ["1", "01.2", "1.2.3", "v1.2", "1.x", "", "².1"])
def test_versions_refuse_what_is_not_a_version(text: str) -> None:
    with pytest.raises(ValueError, match="is not an ACP version"):
        versions.parse(text)
