"""Every registry operation of every kind through ACPClient(LocalTransport), and each
error the contract names: bad specs (with field paths), duplicates, stale revisions,
missing references, removal of referenced entries, built-ins, names, pages, labels and
namespaces."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract import catalog, codec
from cleveragents.acp.contract.call import Principal
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.registries import KINDS
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.service_facade import ServiceFacade
from tests.registry_specs import registry_spec

valid_spec = registry_spec


async def call(client: ACPClient, op: str, **params: Any) -> dict[str, Any]:
    return codec.to_dict(await client.call(op, params))


async def fails(client: ACPClient, op: str, code: str, **params: Any) -> ACPError:
    with pytest.raises(ACPError) as info:
        await client.call(op, params)
    assert info.value.code == code, info.value
    return info.value


@pytest.fixture
async def world(client: ACPClient, tmp_path: pathlib.Path) -> ACPClient:
    """A client whose default namespace has the `base` resource a project needs."""
    await client.call("resource.add", name="base", spec=valid_spec("resource", tmp_path))
    return client


def test_every_registry_operation_is_served(facade: ServiceFacade) -> None:
    registry_ops = {
        f"{kind}.{verb}" for kind in KINDS for verb in ("list", "show", "add", "update", "remove")
    }
    assert registry_ops <= facade.served_operations
    assert registry_ops <= set(catalog.OPERATIONS)


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_lifecycle(world: ACPClient, tmp_path: pathlib.Path, kind: str) -> None:
    k = KINDS[kind]
    spec = valid_spec(kind, tmp_path)
    added = (
        await call(world, f"{kind}.add", name="e1", description="first", labels={"team": "a"}, spec=spec)
    )[k.entry_field]
    assert added["revision"] == 1
    assert added["meta"]["namespace"] == "default"
    assert len(added["meta"]["id"]) == 26
    assert added["labels"] == {"team": "a"}

    shown = (await call(world, f"{kind}.show", name="e1"))[k.entry_field]
    assert shown == added

    listed = (await call(world, f"{kind}.list", labels={"team": "a"}))[k.list_field]
    assert [e["name"] for e in listed] == ["e1"]

    dup = await fails(world, f"{kind}.add", "ALREADY_EXISTS", name="e1", spec=spec)
    assert dup.details["refinement"] == f"{kind.upper()}_ALREADY_EXISTS"

    updated = (
        await call(
            world, f"{kind}.update", name="e1", revision=1, description="second", update_mask="description"
        )
    )[k.entry_field]
    assert updated["revision"] == 2
    assert updated["description"] == "second"
    assert updated["spec"] == added["spec"]
    assert updated["labels"] == {"team": "a"}
    assert updated["meta"]["create_time"] == added["meta"]["create_time"]

    stale = await fails(world, f"{kind}.update", "INVALID_STATE", name="e1", revision=1, description="x")
    assert stale.details["current_revision"] == 2

    # An empty mask replaces description, labels and spec together.
    replaced = (await call(world, f"{kind}.update", name="e1", revision=2, spec=spec, labels={"team": "b"}))[
        k.entry_field
    ]
    assert (replaced["revision"], replaced["description"], replaced["labels"]) == (3, "", {"team": "b"})

    await fails(world, f"{kind}.remove", "INVALID_STATE", name="e1", revision=2)
    removed = (await call(world, f"{kind}.remove", name="e1", revision=3))[k.entry_field]
    assert removed["name"] == "e1"
    missing = await fails(world, f"{kind}.show", "NOT_FOUND", name="e1")
    assert missing.details["refinement"] == f"{kind.upper()}_NOT_FOUND"
    await fails(world, f"{kind}.update", "NOT_FOUND", name="e1", revision=3)
    await fails(world, f"{kind}.remove", "NOT_FOUND", name="e1")


async def test_defaults_are_filled_and_stored(client: ACPClient) -> None:
    tool = (await call(client, "tool.add", name="lint", spec={"argv": ["ruff", "check"]}))["tool"]
    assert tool["spec"]["timeout_seconds"] == 30
    assert tool["spec"]["output_limit_bytes"] == 65536
    action = (
        await call(
            client,
            "action.add",
            name="two",
            spec={
                "actor": "scripted",
                "steps": [{"tool": "fs.read"}, {"id": "custom", "tool": "lint"}, {"tool": "fs.list"}],
            },
        )
    )["action"]
    assert [s["id"] for s in action["spec"]["steps"]] == ["step-1", "custom", "step-3"]
    assert (await call(client, "action.show", name="two"))["action"] == action


BAD_SPECS: list[tuple[str, dict[str, Any], str]] = [
    ("actor", {"provider": "magic"}, "spec.provider"),
    ("actor", {"provider": "openai", "base_url": "http://127.0.0.1:9"}, "spec.model"),
    ("actor", {"provider": "openai", "model": "m"}, "spec.base_url"),
    ("actor", {"provider": "openai", "model": "m", "base_url": "ftp://host"}, "spec.base_url"),
    ("actor", {"provider": "scripted", "api_key_env": "sk-live secret"}, "spec.api_key_env"),
    ("actor", {"provider": "scripted", "cost_per_1k_tokens": -1}, "spec.cost_per_1k_tokens"),
    ("actor", {"provider": "scripted", "skills": ["nosuch"]}, "spec.skills[0]"),
    ("actor", {"provider": "scripted", "skills": [""]}, "spec.skills[0]"),
    ("skill", {"instructions": "  "}, "spec.instructions"),
    ("tool", {"argv": []}, "spec.argv"),
    ("tool", {"argv": [""]}, "spec.argv[0]"),
    ("tool", {"argv": ["x"], "timeout_seconds": 3601}, "spec.timeout_seconds"),
    ("tool", {"argv": ["x"], "timeout_seconds": -1}, "spec.timeout_seconds"),
    ("tool", {"argv": ["x"], "output_limit_bytes": -1}, "spec.output_limit_bytes"),
    ("tool", {"argv": ["x"], "cost": -0.1}, "spec.cost"),
    ("validation", {"paths": ["*.py"]}, "spec.check"),
    ("validation", {"paths": [""], "regex": {"pattern": "x"}}, "spec.paths[0]"),
    ("validation", {"regex": {"pattern": "("}}, "spec.regex.pattern"),
    ("validation", {"json_schema": {"schema": {"type": "nonsense"}}}, "spec.json_schema.schema"),
    ("validation", {"command": {"argv": []}}, "spec.command.argv"),
    ("validation", {"command": {"argv": ["make"], "timeout_seconds": 4000}}, "spec.command.timeout_seconds"),
    ("resource", {"type": "", "path": "/"}, "spec.type"),
    ("resource", {"type": "nosuch", "path": "/"}, "spec.type"),
    ("resource", {"type": "directory", "path": "relative/dir"}, "spec.path"),
    ("resource", {"type": "directory", "path": "/nonexistent/acp-test-dir"}, "spec.path"),
    ("resource_type", {"driver": "s3"}, "spec.driver"),
    ("project", {"resources": []}, "spec.resources"),
    ("project", {"resources": ["nosuch"]}, "spec.resources[0]"),
    ("project", {"resources": ["base", "base"]}, "spec.resources[1]"),
    ("action", {"prompt_template": "x"}, "spec.actor"),
    ("action", {"actor": "nosuch"}, "spec.actor"),
    ("action", {"actor": "scripted", "inputs_schema": {"type": 5}}, "spec.inputs_schema"),
    ("action", {"actor": "scripted", "steps": [{"tool": "fs.read"}, {"tool": ""}]}, "spec.steps[1].tool"),
    (
        "action",
        {"actor": "scripted", "steps": [{"tool": "fs.read"}, {"tool": "nosuch"}]},
        "spec.steps[1].tool",
    ),
    (
        "action",
        {"actor": "scripted", "steps": [{"id": "a", "tool": "fs.read"}, {"id": "a", "tool": "fs.list"}]},
        "spec.steps[1].id",
    ),
    ("action", {"actor": "scripted", "validations": ["nosuch"]}, "spec.validations[0]"),
    ("action", {"actor": "scripted", "invariants": ["nosuch"]}, "spec.invariants[0]"),
    ("action", {"actor": "scripted", "skills": ["nosuch"]}, "spec.skills[0]"),
    ("action", {"actor": "scripted", "automation_profile": "nosuch"}, "spec.automation_profile"),
    ("automation_profile", {"max_steps": -1}, "spec.max_steps"),
    ("automation_profile", {"max_steps": 100_001}, "spec.max_steps"),
    # Regexes RE2 cannot run in linear time are refused, never run by a backtracking engine.
    ("validation", {"regex": {"pattern": "(a)\\1"}}, "spec.regex.pattern"),
    ("validation", {"regex": {"pattern": "a" * 1001}}, "spec.regex.pattern"),
    (
        "validation",
        {"json_schema": {"schema": {"patternProperties": {"(?<=x)": {}}}}},
        "spec.json_schema.schema",
    ),
    ("validation", {"paths": ["*"] * 101, "regex": {"pattern": "x"}}, "spec.paths"),
    ("validation", {"paths": ["a" * 1025], "regex": {"pattern": "x"}}, "spec.paths[0]"),
    (
        "action",
        {"actor": "scripted", "inputs_schema": {"properties": {"x": {"pattern": "(?=a)"}}}},
        "spec.inputs_schema",
    ),
    ("automation_profile", {"cost_budget": -0.5}, "spec.cost_budget"),
    ("automation_profile", {"allowed_tools": ["nosuch"]}, "spec.allowed_tools[0]"),
    ("automation_profile", {"allowed_tools": ["fs.read", "fs.read"]}, "spec.allowed_tools[1]"),
    ("invariant", {}, "spec.rule"),
    ("invariant", {"paths_within": {"globs": []}}, "spec.paths_within.globs"),
    ("invariant", {"paths_within": {"globs": ["src/**", ""]}}, "spec.paths_within.globs[1]"),
    ("invariant", {"max_files_changed": {"limit": 0}}, "spec.max_files_changed.limit"),
    ("invariant", {"forbid_regex": {"pattern": "["}}, "spec.forbid_regex.pattern"),
    ("invariant", {"forbid_regex": {"pattern": "x(?!y)"}}, "spec.forbid_regex.pattern"),
]


async def test_a_schema_pattern_that_cannot_run_in_linear_time_names_its_place(client: ACPClient) -> None:
    schema = {"type": "object", "properties": {"word": {"pattern": "^(\\w)\\1$"}}}
    error = await fails(
        client, "action.add", "INVALID_PARAMS", name="a", spec={"actor": "scripted", "inputs_schema": schema}
    )
    assert error.details == {"field": "spec.inputs_schema", "schema_path": "properties/word/pattern"}
    assert "backreferences (\\1) are not supported" in error.message


async def test_a_profile_without_max_steps_stores_the_default(client: ACPClient) -> None:
    added = await call(client, "automation_profile.add", name="p", spec={"auto_execute": True})
    assert added["automation_profile"]["spec"]["max_steps"] == 1000
    kept = await call(client, "automation_profile.add", name="q", spec={"max_steps": 100_000})
    assert kept["automation_profile"]["spec"]["max_steps"] == 100_000


@pytest.mark.parametrize(("kind", "spec", "field"), BAD_SPECS, ids=[f"{k}-{f}" for k, _, f in BAD_SPECS])
async def test_bad_spec_names_the_field(
    world: ACPClient, kind: str, spec: dict[str, Any], field: str
) -> None:
    error = await fails(world, f"{kind}.add", "INVALID_PARAMS", name="bad", spec=spec)
    assert error.details["field"] == field
    await fails(world, f"{kind}.show", "NOT_FOUND", name="bad")


async def test_bad_spec_on_update_keeps_the_entry(client: ACPClient) -> None:
    await client.call("tool.add", name="t", spec={"argv": ["true"]})
    error = await fails(client, "tool.update", "INVALID_PARAMS", name="t", revision=1, spec={"argv": []})
    assert error.details["field"] == "spec.argv"
    # Masked out, a bad spec is not looked at.
    kept = await call(
        client, "tool.update", name="t", revision=1, spec={"argv": []}, update_mask="description"
    )
    assert kept["tool"]["spec"]["argv"] == ["true"]
    assert kept["tool"]["revision"] == 2
    error = await fails(client, "tool.update", "INVALID_PARAMS", name="t", revision=2, update_mask="argv")
    assert error.details["field"] == "update_mask"


async def test_references_block_removal_and_name_the_referrers(
    world: ACPClient, tmp_path: pathlib.Path
) -> None:
    c = world
    await c.call("skill.add", name="style", spec={"instructions": "Be terse."})
    await c.call("actor.add", name="bot", spec={"provider": "scripted", "skills": ["style"]})
    await c.call("tool.add", name="lint", spec={"argv": ["ruff", "check"]})
    await c.call("validation.add", name="no-todo", spec={"regex": {"pattern": "TODO"}})
    await c.call("invariant.add", name="small", spec={"max_files_changed": {"limit": 3}})
    await c.call(
        "automation_profile.add", name="auto", spec={"auto_execute": True, "allowed_tools": ["lint"]}
    )
    await c.call("resource_type.add", name="folder", spec={"driver": "directory"})
    await c.call("resource.add", name="src", spec={"type": "folder", "path": str(tmp_path)})
    await c.call("project.add", name="app", spec={"resources": ["src", "base"]})
    await c.call(
        "action.add",
        name="deploy",
        spec={
            "actor": "bot",
            "skills": ["style"],
            "validations": ["no-todo"],
            "invariants": ["small"],
            "automation_profile": "auto",
            "steps": [{"tool": "lint"}],
        },
    )
    expected = {
        ("skill", "style"): ["action/deploy", "actor/bot"],
        ("actor", "bot"): ["action/deploy"],
        ("tool", "lint"): ["action/deploy", "automation_profile/auto"],
        ("validation", "no-todo"): ["action/deploy"],
        ("invariant", "small"): ["action/deploy"],
        ("automation_profile", "auto"): ["action/deploy"],
        ("resource_type", "folder"): ["resource/src"],
        ("resource", "src"): ["project/app"],
    }
    for (kind, name), referrers in expected.items():
        error = await fails(c, f"{kind}.remove", "INVALID_STATE", name=name)
        assert error.details["referrers"] == referrers, kind
    await c.call("action.remove", name="deploy")
    await c.call("project.remove", name="app")
    for kind, name in [("actor", "bot"), ("automation_profile", "auto"), ("resource", "src")]:
        await c.call(f"{kind}.remove", name=name)
    for kind, name in [("skill", "style"), ("tool", "lint"), ("resource_type", "folder")]:
        await c.call(f"{kind}.remove", name=name)


async def test_update_checks_references_too(client: ACPClient) -> None:
    await client.call("actor.add", name="bot", spec={"provider": "scripted"})
    error = await fails(
        client,
        "actor.update",
        "INVALID_PARAMS",
        name="bot",
        revision=1,
        spec={"provider": "scripted", "skills": ["x"]},
    )
    assert (error.details["field"], error.details["missing"]) == ("spec.skills[0]", "skill/x")


@pytest.mark.parametrize(
    ("kind", "name"), [("actor", "scripted"), ("actor", "orchestrator"), ("resource_type", "directory")]
)
async def test_builtins_are_listed_and_protected(client: ACPClient, kind: str, name: str) -> None:
    k = KINDS[kind]
    shown = (await call(client, f"{kind}.show", name=name, namespace="elsewhere"))[k.entry_field]
    assert shown["labels"] == {"builtin": "true"}
    assert shown["meta"]["namespace"] == "elsewhere"
    listed = (await call(client, f"{kind}.list", labels={"builtin": "true"}))[k.list_field]
    assert name in [e["name"] for e in listed]
    spec = shown["spec"]
    await fails(client, f"{kind}.add", "ALREADY_EXISTS", name=name, spec=spec)
    error = await fails(client, f"{kind}.update", "INVALID_STATE", name=name, revision=1, description="x")
    assert error.details["builtin"] is True
    await fails(client, f"{kind}.remove", "INVALID_STATE", name=name)
    assert (await call(client, f"{kind}.show", name=name, namespace="elsewhere"))[k.entry_field] == shown


async def test_builtin_tool_names_and_label_are_reserved(client: ACPClient) -> None:
    await fails(client, "tool.add", "ALREADY_EXISTS", name="fs.read", spec={"argv": ["cat"]})
    error = await fails(
        client,
        "skill.add",
        "INVALID_PARAMS",
        name="s",
        labels={"builtin": "true"},
        spec={"instructions": "x"},
    )
    assert error.details["field"] == "labels.builtin"


@pytest.mark.parametrize("name", ["Upper", "-dash", "has space", "a" * 64, "tab\t", "x/y", "trailing\n"])
async def test_bad_names(client: ACPClient, name: str) -> None:
    error = await fails(client, "skill.add", "INVALID_PARAMS", name=name, spec={"instructions": "x"})
    assert error.details["field"] == "name"
    for op in ("skill.show", "skill.remove"):
        assert (await fails(client, op, "INVALID_PARAMS", name=name)).details["field"] == "name"


async def test_good_names_and_missing_fields(client: ACPClient) -> None:
    for name in ("fs.lint", "a", "0-x_y.z", "a" * 63):
        await client.call("tool.add", name=name, spec={"argv": ["true"]})
    error = await fails(client, "skill.add", "INVALID_PARAMS", spec={"instructions": "x"})
    assert error.details["missing_fields"] == ["name"]
    error = await fails(client, "skill.add", "INVALID_PARAMS", name="x")
    assert error.details["missing_fields"] == ["spec"]
    error = await fails(client, "skill.update", "INVALID_PARAMS", name="x")
    assert error.details["missing_fields"] == ["revision"]
    error = await fails(
        client, "skill.add", "INVALID_PARAMS", name="x", labels={"bad key": "v"}, spec={"instructions": "x"}
    )
    assert error.details["field"] == "labels.bad key"


async def test_pagination(client: ACPClient) -> None:
    names = [f"s{i}" for i in range(7)]
    for name in reversed(names):
        await client.call("skill.add", name=name, spec={"instructions": name})
    seen: list[str] = []
    token = ""
    pages = 0
    while True:
        page = await call(client, "skill.list", page_size=3, page_token=token)
        seen.extend(e["name"] for e in page["skills"])
        pages += 1
        token = page["next_page_token"]
        if not token:
            break
    assert (seen, pages) == (names, 3)

    first = await call(client, "skill.list", page_size=3)
    await fails(client, "skill.list", "INVALID_PARAMS", page_token="not-a-token")
    forged = first["next_page_token"][:-2] + ("AA" if not first["next_page_token"].endswith("AA") else "BB")
    assert (await fails(client, "skill.list", "INVALID_PARAMS", page_token=forged)).details[
        "field"
    ] == "page_token"
    # A token belongs to its list: other filters or another kind refuse it.
    await fails(
        client, "skill.list", "INVALID_PARAMS", page_token=first["next_page_token"], labels={"x": "y"}
    )
    await fails(client, "tool.list", "INVALID_PARAMS", page_token=first["next_page_token"])
    assert (await fails(client, "skill.list", "INVALID_PARAMS", page_size=-1)).details["field"] == "page_size"
    everything = await call(client, "skill.list", page_size=100000)
    assert len(everything["skills"]) == 7
    assert everything["next_page_token"] == ""


async def test_label_filters(client: ACPClient) -> None:
    await client.call("skill.add", name="a", labels={"team": "x", "tier": "1"}, spec={"instructions": "a"})
    await client.call("skill.add", name="b", labels={"team": "x"}, spec={"instructions": "b"})
    await client.call("skill.add", name="c", labels={"team": "y", "tier": "1"}, spec={"instructions": "c"})

    async def names(**labels: str) -> list[str]:
        return [e["name"] for e in (await call(client, "skill.list", labels=labels))["skills"]]

    assert await names() == ["a", "b", "c"]
    assert await names(team="x") == ["a", "b"]
    assert await names(team="x", tier="1") == ["a"]
    assert await names(tier="1") == ["a", "c"]
    assert await names(team="z") == []


async def test_namespaces_are_isolated(client: ACPClient) -> None:
    await client.call("skill.add", namespace="a", name="s", spec={"instructions": "from a"})
    await client.call("skill.add", namespace="b", name="s", spec={"instructions": "from b"})
    a = (await call(client, "skill.show", namespace="a", name="s"))["skill"]
    b = (await call(client, "skill.show", namespace="b", name="s"))["skill"]
    assert (a["spec"]["instructions"], b["spec"]["instructions"]) == ("from a", "from b")
    assert a["meta"]["id"] != b["meta"]["id"]
    await fails(client, "skill.show", "NOT_FOUND", name="s")
    only_a = (await call(client, "skill.list", namespace="a"))["skills"]
    assert [(e["meta"]["namespace"], e["name"]) for e in only_a] == [("a", "s")]
    everywhere = (await call(client, "skill.list"))["skills"]
    assert [(e["meta"]["namespace"], e["name"]) for e in everywhere] == [("a", "s"), ("b", "s")]
    # References stay inside a namespace.
    error = await fails(
        client,
        "actor.add",
        "INVALID_PARAMS",
        namespace="c",
        name="bot",
        spec={"provider": "scripted", "skills": ["s"]},
    )
    assert error.details["field"] == "spec.skills[0]"
    await client.call("actor.add", namespace="a", name="bot", spec={"provider": "scripted", "skills": ["s"]})
    await client.call("skill.remove", namespace="b", name="s")
    await fails(client, "skill.remove", "INVALID_STATE", namespace="a", name="s")
    # Listing every namespace shows built-ins in `default` and in namespaces with entries.
    actors = (await call(client, "actor.list"))["actors"]
    assert [(e["meta"]["namespace"], e["name"]) for e in actors] == [
        ("a", "bot"),
        ("a", "orchestrator"),
        ("a", "scripted"),
        ("default", "orchestrator"),
        ("default", "scripted"),
    ]


class OnlyNamespaceA:
    """A real authenticator: one token, one namespace."""

    def authenticate(self, token: str | None) -> Principal:
        if token != "t-a":
            raise ACPError("AUTH_REQUIRED", "bad token")
        return Principal("alice", frozenset({"a"}))


@pytest.fixture
async def client_a(db_path: pathlib.Path) -> AsyncIterator[ACPClient]:
    facade = open_facade(db_path, authenticator=OnlyNamespaceA())
    async with ACPClient(LocalTransport(facade, owns_facade=True), token="t-a") as client:
        yield client


async def test_principal_sees_only_its_namespaces(client_a: ACPClient) -> None:
    await client_a.call("skill.add", namespace="a", name="s", spec={"instructions": "x"})
    await fails(client_a, "skill.add", "AUTH_FORBIDDEN", namespace="b", name="s", spec={"instructions": "x"})
    await fails(client_a, "skill.show", "AUTH_FORBIDDEN", name="s")
    await fails(client_a, "skill.list", "AUTH_FORBIDDEN", namespace="b")
    listed = (await call(client_a, "actor.list"))["actors"]
    assert {e["meta"]["namespace"] for e in listed} == {"a"}
