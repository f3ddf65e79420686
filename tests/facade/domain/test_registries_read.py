"""The read API other domain services use: built-ins, typed fetch, NOT_FOUND refinements."""

from __future__ import annotations

import pathlib

import pytest

from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.registries import KINDS, Registries
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import registry_pb2, specs_pb2


@pytest.fixture
def registries(tmp_path: pathlib.Path) -> Registries:
    return Registries(SQLiteStore(tmp_path / "acp.db"))


def test_kinds_come_from_the_contract() -> None:
    assert sorted(KINDS) == [
        "action",
        "actor",
        "automation_profile",
        "invariant",
        "project",
        "resource",
        "resource_type",
        "skill",
        "tool",
        "validation",
    ]
    assert KINDS["automation_profile"].list_field == "automation_profiles"
    assert KINDS["resource_type"].entry_type is registry_pb2.ResourceType


def test_builtins_are_in_every_namespace(registries: Registries) -> None:
    for namespace in ("default", "team-a"):
        actor = registries.fetch(registry_pb2.Actor, namespace, "scripted")
        assert actor.spec.provider == "scripted"
        assert actor.meta.namespace == namespace
        assert actor.labels["builtin"] == "true"
    assert [a.name for a in registries.entries("actor", "x")] == ["orchestrator", "scripted"]  # type: ignore[attr-defined]
    assert registries.find("resource_type", "x", "directory") is not None


@pytest.mark.parametrize("kind", ["actor", "automation_profile"])
def test_missing_entry_is_refined_not_found(registries: Registries, kind: str) -> None:
    assert registries.find(kind, "default", "nope") is None
    with pytest.raises(ACPError) as info:
        registries.get(kind, "default", "nope")
    assert info.value.code == "NOT_FOUND"
    assert info.value.details["refinement"] == f"{kind.upper()}_NOT_FOUND"


def test_unknown_kind_is_invalid_params(registries: Registries) -> None:
    with pytest.raises(ACPError) as info:
        registries.find("widget", "default", "x")
    assert info.value.code == "INVALID_PARAMS"


def test_entries_fetch_and_referrers(registries: Registries, tmp_path: pathlib.Path) -> None:
    registries.add("skill", "default", "style", spec=specs_pb2.SkillSpec(instructions="Be terse."))
    registries.add("actor", "default", "bot", spec=specs_pb2.ActorSpec(provider="scripted", skills=["style"]))
    names = [
        registry_pb2.Actor.FromString(e.SerializeToString()).name
        for e in registries.entries("actor", "default")
    ]
    assert names == ["bot", "orchestrator", "scripted"]
    assert registries.fetch(registry_pb2.Actor, "default", "bot").spec.skills == ["style"]
    assert registries.referrers("skill", "default", "style") == ["actor/bot"]
    assert registries.referrers("skill", "other", "style") == []


def test_outside_referrers_block_removal(registries: Registries) -> None:
    registries.add("skill", "default", "style", spec=specs_pb2.SkillSpec(instructions="Be terse."))
    registries.add_referrer_source(
        lambda kind, namespace, name: ["session/01J0000000000000000000000"] if name == "style" else []
    )
    with pytest.raises(ACPError) as info:
        registries.remove("skill", "default", "style")
    assert info.value.code == "INVALID_STATE"
    assert info.value.details["referrers"] == ["session/01J0000000000000000000000"]


def test_wrong_spec_type_is_invalid_params(registries: Registries) -> None:
    with pytest.raises(ACPError) as info:
        registries.add("skill", "default", "s", spec=specs_pb2.ToolSpec(argv=["x"]))
    assert info.value.details["field"] == "spec"
