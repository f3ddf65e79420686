"""The scenarios of the contract suite, written once against ``ACPClient``.

Each takes a ``Run`` (recording clients over one backend) and drives the operations a user
would, wrong inputs and other namespaces included; ``test_scenarios`` runs each on the
three transports and compares the traces. Together they call every operation of the
catalog and provoke every error an operation can answer (``test_coverage`` checks both).
Principals (``tests.server_process.Tokens``): alice uses ``default``, bob ``other``, root all.
Longer than 600 lines: one scenario per area of the catalog, read one at a time, and
``test_coverage`` needs them in one module to see the whole catalog covered.
"""

from __future__ import annotations

import hashlib
import pathlib
from collections.abc import Callable
from typing import Any

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.contract import catalog, codec, versions
from cleveragents.acp.v1 import events_pb2, plan_pb2
from tests.conformance.harness import Run, Scenario
from tests.facade.plans.helpers import INPUTS, SCHEMA, STEPS, write_tree
from tests.registry_specs import registry_spec

SCENARIOS: dict[str, Scenario] = {}
MISSING_ID = "01J00000000000000000000000"
FORGED_TOKEN = "Zm9yZ2Vk"
REGISTRY_VERBS = frozenset({"list", "show", "add", "update", "remove"})
# A registry kind is a service with exactly the five registry verbs (``project.resolve``,
# ACP 1.3, is another service's; webhooks have more verbs in their own).
_BY_SERVICE: dict[str, list[catalog.Operation]] = {}
for _op in catalog.OPERATIONS.values():
    _BY_SERVICE.setdefault(_op.service, []).append(_op)
REGISTRY_KINDS = sorted(
    ops[0].group for ops in _BY_SERVICE.values() if {op.verb for op in ops} == REGISTRY_VERBS
)


def scenario(name: str) -> Callable[[Scenario], Scenario]:
    def register(function: Scenario) -> Scenario:
        SCENARIOS[name] = function
        return function

    return register


def folder(run: Run, name: str) -> pathlib.Path:
    path = run.root / name
    write_tree(path)
    return path


# Entries a registry holds before anyone adds one.
BUILT_IN = {
    "actor": ["orchestrator", "scripted"],
    "resource_type": ["directory"],
    "tool": ["fs.delete", "fs.list", "fs.read", "fs.replace", "fs.write"],
}


def names(answer: Any) -> list[str]:
    """The names a registry list answered, in its order."""
    return [entry["name"] for entry in entries(codec.to_dict(answer))]


def registry_scenario(kind: str) -> Scenario:
    async def run_kind(run: Run) -> None:
        alice, bob = run.client("alice"), run.client("bob")
        # What alice's namespace lists once e1..e3 are added: by name.
        listed = sorted(
            [*BUILT_IN.get(kind, []), *(["base"] if kind == "resource" else []), "e1", "e2", "e3"]
        )
        root = folder(run, "base")
        for namespace in ("default", "other"):
            await run.client("root").call(
                "resource.add", namespace=namespace, name="base", spec=registry_spec("resource", root)
            )
        spec = registry_spec(kind, root)
        for index, team in enumerate(["a", "a", "b"], start=1):
            await alice.call(f"{kind}.add", name=f"e{index}", labels={"team": team}, spec=spec)
        await run.fails(
            alice.call(f"{kind}.add", name="e1", spec=spec),
            "ALREADY_EXISTS",
            f"{kind.upper()}_ALREADY_EXISTS",
        )
        await run.fails(alice.call(f"{kind}.add", name="e4"), "INVALID_PARAMS")
        await run.fails(alice.call(f"{kind}.add", name="Not A Name", spec=spec), "INVALID_PARAMS")
        await run.fails(alice.call(f"{kind}.add", name="e5", spec={"bogus": 1}), "INVALID_PARAMS")
        await run.fails(
            alice.call(f"{kind}.add", name="e5", spec=spec, labels={"bad key": "x"}), "INVALID_PARAMS"
        )
        await run.fails(bob.call(f"{kind}.add", namespace="default", name="e5", spec=spec), "AUTH_FORBIDDEN")
        theirs = await bob.call(f"{kind}.add", namespace="other", name="e1", spec=spec)
        assert entry_of(kind, theirs)["meta"]["namespace"] == "other", theirs
        shown = entry_of(kind, await alice.call(f"{kind}.show", name="e1"))
        assert (shown["name"], shown["meta"]["namespace"], shown["revision"], shown["labels"]) == (
            "e1",
            "default",
            1,
            {"team": "a"},
        ), shown
        await run.fails(alice.call(f"{kind}.show", name="nope"), "NOT_FOUND", f"{kind.upper()}_NOT_FOUND")
        await run.fails(alice.call(f"{kind}.show"), "INVALID_PARAMS")
        await run.fails(bob.call(f"{kind}.show", namespace="default", name="e1"), "AUTH_FORBIDDEN")
        first = await alice.call(f"{kind}.list", page_size=2)
        token = first.next_page_token  # type: ignore[attr-defined]
        assert token
        assert names(first) == listed[:2], first
        second = await alice.call(f"{kind}.list", page_size=2, page_token=token)
        assert names(second) == listed[2:4], second
        assert bool(second.next_page_token) == (len(listed) > 4), second  # type: ignore[attr-defined]
        await run.fails(
            alice.call(f"{kind}.list", page_size=2, page_token=token, labels={"team": "a"}), "INVALID_PARAMS"
        )
        team_a = await alice.call(f"{kind}.list", labels={"team": "a"})
        assert (names(team_a), team_a.next_page_token) == (["e1", "e2"], ""), team_a  # type: ignore[attr-defined]
        await run.fails(alice.call(f"{kind}.list", page_token=FORGED_TOKEN), "INVALID_PARAMS")
        await run.fails(alice.call(f"{kind}.list", page_size=-1), "INVALID_PARAMS")
        await run.fails(bob.call(f"{kind}.list", namespace="default"), "AUTH_FORBIDDEN")
        await root_lists(run, f"{kind}.list")
        updated = await alice.call(
            f"{kind}.update", name="e1", revision=1, description="changed", update_mask="description"
        )
        changed = entry_of(kind, updated)
        assert (changed["description"], changed["revision"], changed["labels"]) == (
            "changed",
            2,
            {"team": "a"},
        )
        await run.fails(
            alice.call(f"{kind}.update", name="e1", revision=1, description="again"), "INVALID_STATE"
        )
        await run.fails(
            alice.call(f"{kind}.update", name="nope", revision=1), "NOT_FOUND", f"{kind.upper()}_NOT_FOUND"
        )
        await run.fails(alice.call(f"{kind}.update", name="e1"), "INVALID_PARAMS")
        await run.fails(
            alice.call(f"{kind}.update", name="e1", revision=2, update_mask="bogus"), "INVALID_PARAMS"
        )
        await run.fails(
            bob.call(f"{kind}.update", namespace="default", name="e1", revision=2), "AUTH_FORBIDDEN"
        )
        await run.fails(alice.call(f"{kind}.remove", name="e3", revision=7), "INVALID_STATE")
        removed = entry_of(kind, await alice.call(f"{kind}.remove", name="e3"))
        assert (removed["name"], removed["labels"]) == ("e3", {"team": "b"}), removed
        await run.fails(alice.call(f"{kind}.remove", name="e3"), "NOT_FOUND", f"{kind.upper()}_NOT_FOUND")
        await run.fails(alice.call(f"{kind}.remove"), "INVALID_PARAMS")
        await run.fails(bob.call(f"{kind}.remove", namespace="default", name="e2"), "AUTH_FORBIDDEN")
        left = await alice.call(f"{kind}.list")
        assert names(left) == [name for name in listed if name != "e3"], left

    return run_kind


def entry_of(kind: str, answer: Any) -> dict[str, Any]:
    """The registry entry an add, show, update or remove answered."""
    entry: dict[str, Any] = codec.to_dict(answer)[kind]
    return entry


def entries(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The items of a list answer (its one repeated field)."""
    (items,) = [value for value in data.values() if isinstance(value, list)]
    return items


async def root_lists(run: Run, operation: str) -> None:
    """A principal of every namespace sees both; one of ``other`` only its own, all of
    which the first sees too (each namespace has entries here)."""
    seen = {}
    for who in ("root", "bob"):
        answer = await run.client(who).call(operation, page_size=500)
        seen[who] = {(e["meta"]["namespace"], e["meta"]["id"]) for e in entries(codec.to_dict(answer))}
    assert {namespace for namespace, _ in seen["root"]} == {"default", "other"}, seen
    assert {namespace for namespace, _ in seen["bob"]} == {"other"}, seen
    assert seen["bob"] < seen["root"], seen


for _kind in REGISTRY_KINDS:
    scenario(f"registry.{_kind}")(registry_scenario(_kind))


@scenario("registry.references")
async def references(run: Run) -> None:
    """Entries naming others: missing names refused, named entries kept, built-ins fixed."""
    alice = run.client()
    root = folder(run, "repo")
    await run.fails(alice.call("project.add", name="p", spec={"resources": ["missing"]}), "INVALID_PARAMS")
    await alice.call("resource.add", name="repo", spec={"type": "directory", "path": str(root)})
    await alice.call("project.add", name="p", spec={"resources": ["repo"]})
    await run.fails(alice.call("resource.remove", name="repo"), "INVALID_STATE")
    await alice.call("skill.add", name="tone", spec={"instructions": "Be kind."})
    await alice.call("actor.add", name="writer", spec={"provider": "scripted", "skills": ["tone"]})
    await run.fails(alice.call("skill.remove", name="tone"), "INVALID_STATE")
    await run.fails(alice.call("action.add", name="a", spec={"actor": "ghost"}), "INVALID_PARAMS")
    await alice.call("validation.add", name="v", spec={"regex": {"pattern": "x"}})
    await alice.call("invariant.add", name="i", spec={"paths_within": {"globs": ["**"]}})
    await alice.call("automation_profile.add", name="auto", spec={"allowed_tools": ["fs.write"]})
    action = {"actor": "writer", "validations": ["v"], "invariants": ["i"], "automation_profile": "auto"}
    await alice.call("action.add", name="a", spec=action)
    for kind, name in [
        ("actor", "writer"),
        ("validation", "v"),
        ("invariant", "i"),
        ("automation_profile", "auto"),
    ]:
        await run.fails(alice.call(f"{kind}.remove", name=name), "INVALID_STATE")
    await alice.call("action.remove", name="a")
    await alice.call("actor.remove", name="writer")
    await run.fails(alice.call("actor.add", name="scripted", spec={"provider": "scripted"}), "ALREADY_EXISTS")
    await run.fails(alice.call("actor.update", name="scripted", revision=1), "INVALID_STATE")
    await run.fails(alice.call("actor.remove", name="orchestrator"), "INVALID_STATE")
    await run.fails(alice.call("resource_type.remove", name="directory"), "INVALID_STATE")
    await run.fails(alice.call("tool.add", name="fs.read", spec={"argv": ["cat"]}), "ALREADY_EXISTS")
    builtin = await alice.call("actor.list", labels={"builtin": "true"})
    assert names(builtin) == BUILT_IN["actor"], builtin


@scenario("project.resolve")
async def project_resolve(run: Run) -> None:
    """ACP 1.3: the project whose directory resource holds a path, the deepest resource
    first; a path outside every project is NOT_FOUND saying how to register one; a relative
    or empty path is INVALID_PARAMS; another namespace's project is not found for bob."""
    alice, bob = run.client(), run.client("bob")
    outer, inner = folder(run, "outer"), folder(run, "outer/inner")
    await alice.call("resource.add", name="outer", spec={"type": "directory", "path": str(outer)})
    await alice.call("resource.add", name="inner", spec={"type": "directory", "path": str(inner)})
    await alice.call("project.add", name="big", spec={"resources": ["outer"]})
    await alice.call("project.add", name="small", spec={"resources": ["inner"]})
    found = codec.to_dict(await alice.call("project.resolve", path=f"{inner}/docs/../src"))
    assert (found["project"]["name"], found["resource"], found["relative_path"]) == (
        "small",
        "inner",
        "src",
    ), found
    found = codec.to_dict(await alice.call("project.resolve", path=str(outer)))
    assert (found["project"]["name"], found["resource"], found.get("relative_path", "")) == (
        "big",
        "outer",
        "",
    ), found
    err = await run.fails(
        alice.call("project.resolve", path=f"{outer}-sibling"), "NOT_FOUND", "PROJECT_NOT_FOUND"
    )
    assert "agents project add" in err.message, err
    await run.fails(bob.call("project.resolve", path=str(inner)), "NOT_FOUND", "PROJECT_NOT_FOUND")
    await run.fails(bob.call("project.resolve", path=str(inner), namespace="default"), "AUTH_FORBIDDEN")
    for path in ("relative/path", "", "/" + "a" * 5000):
        await run.fails(alice.call("project.resolve", path=path), "INVALID_PARAMS")


@scenario("meta")
async def meta(run: Run) -> None:
    for who in (None, "bob"):
        served = await run.client(who).call("meta.version")
        assert (served.current_version, list(served.supported_versions)) == (  # type: ignore[attr-defined]
            versions.CURRENT,
            list(versions.SUPPORTED),
        ), served
    await run.fails(run.client(None, acp_version="1.0").call("meta.version"), "VERSION_MISMATCH")
    await run.fails(run.client(None, acp_version="2.0").call("meta.version"), "VERSION_MISMATCH")
    await run.fails(run.client("alice", acp_version="1.0").call("plan.list"), "VERSION_MISMATCH")
    await run.fails(run.client(None).call("session.list"), "AUTH_REQUIRED")
    await run.fails(run.client("acp_not-a-token").call("session.list"), "AUTH_REQUIRED")


ACTIVE = "SESSION_STATE_ACTIVE"


def session_of(answer: Any) -> dict[str, Any]:
    session: dict[str, Any] = codec.to_dict(answer)["session"]
    return session


def ids_of(answer: Any) -> list[str]:
    """The ids a list answered, in its order."""
    return [item["meta"]["id"] for item in entries(codec.to_dict(answer))]


def titles(answer: Any) -> list[str]:
    return [item["title"] for item in entries(codec.to_dict(answer))]


@scenario("sessions")
async def sessions(run: Run) -> None:
    alice, bob = run.client(), run.client("bob")
    root = folder(run, "web")
    await alice.call("resource.add", name="web", spec={"type": "directory", "path": str(root)})
    await alice.call("project.add", name="web", spec={"resources": ["web"]})
    ids = []
    for index in range(3):
        created = await alice.call(
            "session.create", title=f"s{index}", labels={"n": str(index)}, project="web"
        )
        ids.append(created.session.meta.id)  # type: ignore[attr-defined]
    plain = session_of(await alice.call("session.create", title="no project"))
    assert (plain["title"], plain["project"], plain["orchestrator"], plain["state"]) == (
        "no project",
        "",
        "orchestrator",
        ACTIVE,
    ), plain
    await run.fails(alice.call("session.create", orchestrator="ghost"), "INVALID_PARAMS")
    await run.fails(alice.call("session.create", project="ghost"), "INVALID_PARAMS")
    await run.fails(alice.call("session.create", labels={"bad key": "x"}), "INVALID_PARAMS")
    await run.fails(bob.call("session.create", namespace="default"), "AUTH_FORBIDDEN")
    theirs = session_of(await bob.call("session.create", namespace="other", title="bob's"))
    assert (theirs["meta"]["namespace"], theirs["title"]) == ("other", "bob's"), theirs

    # Newest first.
    page = await alice.call("session.list", page_size=2)
    assert (titles(page), bool(page.next_page_token)) == (["no project", "s2"], True), page  # type: ignore[attr-defined]
    rest = await alice.call("session.list", page_size=2, page_token=page.next_page_token)  # type: ignore[attr-defined]
    assert (titles(rest), rest.next_page_token) == (["s1", "s0"], ""), rest  # type: ignore[attr-defined]
    await run.fails(
        alice.call("session.list", page_size=2, page_token=page.next_page_token, project="web"),  # type: ignore[attr-defined]
        "INVALID_PARAMS",
    )
    web = await alice.call("session.list", project="web", actor="orchestrator", state="SESSION_STATE_ACTIVE")
    assert ids_of(web) == ids[::-1], web
    await run.fails(alice.call("session.list", page_token=FORGED_TOKEN), "INVALID_PARAMS")
    await run.fails(alice.call("session.list", page_size=-1), "INVALID_PARAMS")
    await run.fails(bob.call("session.list", namespace="default"), "AUTH_FORBIDDEN")
    await root_lists(run, "session.list")

    first = ids[0]
    shown = session_of(await alice.call("session.show", session_id=first))
    assert (shown["meta"]["id"], shown["title"], shown["labels"], shown["project"], shown["state"]) == (
        first,
        "s0",
        {"n": "0"},
        "web",
        ACTIVE,
    ), shown
    await run.fails(alice.call("session.show", session_id=MISSING_ID), "NOT_FOUND", "SESSION_NOT_FOUND")
    await run.fails(alice.call("session.show"), "INVALID_PARAMS")
    await run.fails(bob.call("session.show", session_id=first), "NOT_FOUND", "SESSION_NOT_FOUND")

    for content in ("/help", "hello there"):
        told = codec.to_dict(await alice.call("session.tell", session_id=first, content=content))
        assert (told["message"]["content"], told["message"]["role"]) == (content, "MESSAGE_ROLE_USER"), told
        assert [r["role"] for r in told["replies"]] == ["MESSAGE_ROLE_ORCHESTRATOR"], told
    await run.fails(alice.call("session.tell", session_id=first), "INVALID_PARAMS")
    # ACP 1.3's session operations name what they are missing the same way.
    await run.fails(alice.call("session.update", session_id=first), "INVALID_PARAMS")
    await run.fails(alice.call("session.turn", session_id=first), "INVALID_PARAMS")
    await run.fails(alice.call("session.cancel_turn", session_id=first), "INVALID_PARAMS")
    await run.fails(alice.call("session.tell", session_id=first, content="x" * 100_001), "INVALID_PARAMS")
    await run.fails(
        alice.call("session.tell", session_id=MISSING_ID, content="hi"), "NOT_FOUND", "SESSION_NOT_FOUND"
    )
    await run.fails(
        bob.call("session.tell", session_id=first, content="hi"), "NOT_FOUND", "SESSION_NOT_FOUND"
    )
    await run.fails(alice.call("session.resume", session_id=first), "INVALID_STATE")
    await alice.call("session.tell", session_id=first, content="/close")
    closed = await alice.call("session.list", state="SESSION_STATE_CLOSED")
    assert ids_of(closed) == [first], closed
    await run.fails(alice.call("session.tell", session_id=first, content="hi"), "INVALID_STATE")
    await run.fails(bob.call("session.resume", session_id=first), "NOT_FOUND", "SESSION_NOT_FOUND")
    await run.fails(alice.call("session.resume", session_id=MISSING_ID), "NOT_FOUND", "SESSION_NOT_FOUND")
    await run.fails(alice.call("session.resume"), "INVALID_PARAMS")
    resumed = session_of(await alice.call("session.resume", session_id=first))
    assert (resumed["meta"]["id"], resumed["state"]) == (first, ACTIVE), resumed
    assert resumed["meta"]["update_time"] > shown["meta"]["update_time"], (resumed, shown)
    closed = await alice.call("session.list", state="SESSION_STATE_CLOSED")
    assert ids_of(closed) == [], closed

    # An orchestrator that cannot orchestrate: refused, nothing stored.
    await alice.call("actor.add", name="plain", spec={"provider": "scripted"})
    odd = await alice.call("session.create", orchestrator="plain")
    await run.fails(alice.call("session.tell", session_id=odd.session.meta.id, content="hi"), "INVALID_STATE")  # type: ignore[attr-defined]
    await run.fails(alice.call("actor.remove", name="plain"), "INVALID_STATE")

    await run.fails(bob.call("session.delete", session_id=first), "NOT_FOUND", "SESSION_NOT_FOUND")
    deleted = await alice.call("session.delete", session_id=ids[2])
    assert codec.to_dict(deleted) == {"session_id": ids[2]}, deleted
    await run.fails(alice.call("session.delete", session_id=ids[2]), "NOT_FOUND", "SESSION_NOT_FOUND")
    await run.fails(alice.call("session.delete"), "INVALID_PARAMS")
    left = await alice.call("session.list", project="web")
    assert ids_of(left) == [ids[1], first], left
    events = await run.events(
        alice,
        lambda e: e.session_message.message.content.startswith("Closed") or e.sequence >= 6,
        session_id=first,
    )
    assert {e.session_id for e in events} == {first}, events
    assert [e.sequence for e in events] == sorted({e.sequence for e in events}), events
    run.note("session events", [codec.to_dict(e) for e in events])


@scenario("session.export")
async def export_import(run: Run) -> None:
    alice, bob, root = run.client(), run.client("bob"), run.client("root")
    source = folder(run, "web")
    await alice.call("resource.add", name="web", spec={"type": "directory", "path": str(source)})
    await alice.call("skill.add", name="tone", spec={"instructions": "Be kind."})
    created = await alice.call("session.create", title="exported", labels={"team": "a"})
    session_id = created.session.meta.id  # type: ignore[attr-defined]
    await alice.call("session.tell", session_id=session_id, content="/help")
    config = {"sources": [{"resource": "web", "globs": ["**/*.md"]}], "skills": ["tone"], "token_budget": 100}
    await alice.call("context.set", session_id=session_id, config=config)
    exported = await alice.call("session.export", session_id=session_id)
    document = codec.to_dict(exported)["document"]
    assert (
        document["session"]["meta"]["id"],
        document["session"]["title"],
        document["session"]["labels"],
    ) == (
        session_id,
        "exported",
        {"team": "a"},
    ), document
    assert [m["content"] for m in document["messages"]][:1] == ["/help"], document
    assert document["context"]["token_budget"] == 100, document
    await run.fails(alice.call("session.export", session_id=MISSING_ID), "NOT_FOUND", "SESSION_NOT_FOUND")
    await run.fails(alice.call("session.export"), "INVALID_PARAMS")
    await run.fails(bob.call("session.export", session_id=session_id), "NOT_FOUND", "SESSION_NOT_FOUND")

    await run.fails(
        alice.call("session.import", document=document), "ALREADY_EXISTS", "SESSION_ALREADY_EXISTS"
    )
    copy = session_of(await alice.call("session.import", document=document, new_id=True))
    assert copy["meta"]["id"] != session_id, copy
    assert (copy["title"], copy["labels"], copy["meta"]["namespace"]) == (
        "exported",
        {"team": "a"},
        "default",
    ), copy
    await run.fails(alice.call("session.import"), "INVALID_PARAMS")
    await run.fails(alice.call("session.import", document={**document, "format": "other"}), "INVALID_PARAMS")
    await run.fails(alice.call("session.import", document={**document, "extra": 1}), "INVALID_PARAMS")
    await run.fails(bob.call("session.import", document=document, new_id=True), "AUTH_FORBIDDEN")
    await run.fails(
        bob.call("session.import", document=document, new_id=True, namespace="default"), "AUTH_FORBIDDEN"
    )
    # Into ``other``, which lacks the resource and skill the context names.
    await run.fails(
        root.call("session.import", document=document, new_id=True, namespace="other"), "INVALID_PARAMS"
    )
    without_context = {**document, "context": None}
    moved = session_of(
        await root.call("session.import", document=without_context, new_id=True, namespace="other")
    )
    assert (moved["meta"]["namespace"], moved["title"]) == ("other", "exported"), moved
    await alice.call("session.delete", session_id=session_id)
    back = session_of(await alice.call("session.import", document=document))
    assert back["meta"] == document["session"]["meta"], (back, document)
    shown = session_of(await alice.call("session.show", session_id=session_id))
    assert (shown["title"], shown["message_count"]) == ("exported", len(document["messages"])), shown
    again = codec.to_dict(await alice.call("session.export", session_id=session_id))["document"]
    assert again["messages"] == document["messages"], again


INCLUDED, DROPPED = "ITEM_DISPOSITION_INCLUDED", "ITEM_DISPOSITION_DROPPED"


@scenario("context")
async def context(run: Run) -> None:
    alice, bob = run.client(), run.client("bob")
    source = folder(run, "web")
    await alice.call("resource.add", name="web", spec={"type": "directory", "path": str(source)})
    await alice.call("project.add", name="web", spec={"resources": ["web"]})
    await alice.call("skill.add", name="tone", spec={"instructions": "Be kind and brief."})
    created = await alice.call("session.create", project="web")
    session_id = created.session.meta.id  # type: ignore[attr-defined]

    # Nothing set yet: the project's resources, whole, unbounded.
    default = {"sources": [{"resource": "web", "globs": []}], "skills": [], "token_budget": 0}
    for scope in ({"project": "web"}, {"session_id": session_id}):
        shown = codec.to_dict(await alice.call("context.show", scope))
        assert (shown["config"], shown["origin"]) == (default, "default"), shown
    await run.fails(alice.call("context.show"), "INVALID_PARAMS")
    await run.fails(alice.call("context.show", project="web", session_id=session_id), "INVALID_PARAMS")
    await run.fails(alice.call("context.show", project="ghost"), "NOT_FOUND", "PROJECT_NOT_FOUND")
    await run.fails(alice.call("context.show", session_id=MISSING_ID), "NOT_FOUND", "SESSION_NOT_FOUND")
    await run.fails(bob.call("context.show", session_id=session_id), "NOT_FOUND", "SESSION_NOT_FOUND")
    await run.fails(bob.call("context.show", project="web", namespace="default"), "AUTH_FORBIDDEN")

    config = {
        "sources": [{"resource": "web", "globs": ["**/*.md", "src/*.py"]}],
        "skills": ["tone"],
        "token_budget": 40,
    }
    project_set = codec.to_dict(
        await alice.call("context.set", project="web", config={"sources": [{"resource": "web"}]})
    )
    assert project_set["config"] == {**default, "sources": [{"resource": "web", "globs": []}]}, project_set
    session_set = codec.to_dict(await alice.call("context.set", session_id=session_id, config=config))
    assert session_set["config"] == config, session_set
    await run.fails(alice.call("context.set", session_id=session_id), "INVALID_PARAMS")
    await run.fails(
        alice.call(
            "context.set", session_id=session_id, config={"sources": [{"resource": "web", "globs": ["../x"]}]}
        ),
        "INVALID_PARAMS",
    )
    await run.fails(
        alice.call("context.set", session_id=session_id, config={"skills": ["ghost"]}), "INVALID_PARAMS"
    )
    await run.fails(alice.call("context.set", project="ghost", config={}), "NOT_FOUND", "PROJECT_NOT_FOUND")
    await run.fails(
        alice.call("context.set", session_id=MISSING_ID, config={}), "NOT_FOUND", "SESSION_NOT_FOUND"
    )
    await run.fails(
        bob.call("context.set", session_id=session_id, config={}), "NOT_FOUND", "SESSION_NOT_FOUND"
    )
    await run.fails(bob.call("context.set", project="web", namespace="default", config={}), "AUTH_FORBIDDEN")
    shown = codec.to_dict(await alice.call("context.show", session_id=session_id))
    assert (shown["config"], shown["origin"]) == (config, "session"), shown
    await run.fails(alice.call("skill.remove", name="tone"), "INVALID_STATE")

    readme = codec.to_dict(
        await alice.call("context.inspect", session_id=session_id, item_id="file:web/README.md")
    )
    assert readme["item"]["content"] == (source / "README.md").read_text(), readme
    skill = codec.to_dict(await alice.call("context.inspect", session_id=session_id, item_id="skill:tone"))
    assert (skill["item"]["kind"], skill["item"]["content"]) == ("skill", "Be kind and brief."), skill
    await run.fails(alice.call("context.inspect", session_id=session_id), "INVALID_PARAMS")
    await run.fails(
        alice.call("context.inspect", session_id=session_id, item_id="file:web/../x"), "INVALID_PARAMS"
    )
    await run.fails(
        alice.call("context.inspect", session_id=session_id, item_id="nonsense"), "INVALID_PARAMS"
    )
    await run.fails(
        alice.call("context.inspect", session_id=session_id, item_id="file:web/obsolete.txt"),
        "NOT_FOUND",
        "CONTEXT_ITEM_NOT_FOUND",
    )
    await run.fails(
        alice.call("context.inspect", project="ghost", item_id="skill:tone"), "NOT_FOUND", "PROJECT_NOT_FOUND"
    )
    await run.fails(
        alice.call("context.inspect", session_id=MISSING_ID, item_id="skill:tone"),
        "NOT_FOUND",
        "SESSION_NOT_FOUND",
    )
    await run.fails(
        bob.call("context.inspect", session_id=session_id, item_id="skill:tone"),
        "NOT_FOUND",
        "SESSION_NOT_FOUND",
    )
    await run.fails(
        bob.call("context.inspect", project="web", namespace="default", item_id="skill:tone"),
        "AUTH_FORBIDDEN",
    )

    # The session's globs and skill, in budget; the prompt first.
    simulated = codec.to_dict(
        await alice.call("context.simulate", session_id=session_id, prompt="Summarize the project.")
    )
    assert [(i["id"], i["disposition"]) for i in simulated["items"]] == [
        ("prompt", INCLUDED),
        ("skill:tone", INCLUDED),
        ("file:web/README.md", INCLUDED),
        ("file:web/src/app.py", INCLUDED),
    ], simulated
    assert simulated["total_tokens"] == sum(i["tokens"] for i in simulated["items"]) <= 40, simulated
    # The project's whole folder in 3 tokens: one truncated, the rest dropped.
    tight = codec.to_dict(await alice.call("context.simulate", project="web", prompt="x", token_budget=3))
    assert [(i["id"], i["disposition"]) for i in tight["items"]] == [
        ("prompt", INCLUDED),
        ("file:web/README.md", "ITEM_DISPOSITION_TRUNCATED"),
        ("file:web/data/blob.bin", DROPPED),
        ("file:web/obsolete.txt", DROPPED),
        ("file:web/src/app.py", DROPPED),
    ], tight
    assert tight["total_tokens"] == sum(i["tokens"] for i in tight["items"]) == 3, tight
    await run.fails(alice.call("context.simulate", session_id=session_id, token_budget=-1), "INVALID_PARAMS")
    await run.fails(alice.call("context.simulate", project="ghost"), "NOT_FOUND", "PROJECT_NOT_FOUND")
    await run.fails(alice.call("context.simulate", session_id=MISSING_ID), "NOT_FOUND", "SESSION_NOT_FOUND")
    await run.fails(bob.call("context.simulate", session_id=session_id), "NOT_FOUND", "SESSION_NOT_FOUND")
    await run.fails(bob.call("context.simulate", project="web", namespace="default"), "AUTH_FORBIDDEN")


async def plan_world(run: Run, *, profile: dict[str, Any] | None = None, **action: Any) -> pathlib.Path:
    """The project ``proj`` over a folder, and the action ``act`` of the plan tests."""
    alice = run.client()
    repo = folder(run, "repo")
    await alice.call("resource.add", name="repo", spec={"type": "directory", "path": str(repo)})
    await alice.call("project.add", name="proj", spec={"resources": ["repo"]})
    if profile is not None:
        await alice.call("automation_profile.add", name="prof", spec=profile)
        action["automation_profile"] = "prof"
    spec = {
        "actor": "scripted",
        "prompt_template": "Write the {{name}} guide.",
        "steps": STEPS,
        "inputs_schema": SCHEMA,
    }
    await alice.call("action.add", name="act", spec={**spec, **action})
    return repo


def is_state(state: int) -> Callable[[events_pb2.Event], bool]:
    return lambda e: e.type == "plan.state_changed" and e.plan_state_changed.to_state == state


async def use(client: ACPClient, **fields: Any) -> str:
    used = await client.call("plan.use", {"action": "act", "project": "proj", "inputs": INPUTS, **fields})
    return str(used.plan.meta.id)  # type: ignore[attr-defined]


READ_VIEWS = ("plan.status", "plan.tree", "plan.explain", "plan.diff", "plan.artifacts")


def plan_of(answer: Any) -> dict[str, Any]:
    plan: dict[str, Any] = codec.to_dict(answer)["plan"]
    return plan


def state_of(answer: Any) -> tuple[str, str, str]:
    plan = plan_of(answer)
    return plan["meta"]["id"], plan["state"], plan["phase"]


# What the plan of ``act`` changes (``tests.facade.plans.helpers.STEPS``), by path.
CHANGES = [
    ("docs/guide.md", "ARTIFACT_OP_CREATE"),
    ("obsolete.txt", "ARTIFACT_OP_DELETE"),
    ("src/app.py", "ARTIFACT_OP_MODIFY"),
]


# A diff showing no file: its digest (ACP 1.3) is over no artifact.
NO_DIFF = {"digest": "sha256:" + hashlib.sha256(b"").hexdigest(), "files": []}


def changes(answer: Any, field: str) -> list[tuple[str, str]]:
    return [(item["path"], item["op"]) for item in codec.to_dict(answer)[field]]


@scenario("plan.lifecycle")
async def plan_lifecycle(run: Run) -> None:
    alice, bob = run.client(), run.client("bob")
    repo = await plan_world(run)
    plan_id = await use(alice)
    # A draft: nothing decided, run or changed yet.
    pending = await alice.call("plan.status", plan_id=plan_id)
    assert state_of(pending) == (plan_id, "PLAN_STATE_PENDING", "PLAN_PHASE_STRATEGIZE"), pending
    assert plan_of(pending)["progress"] == {"total": 3, "done": 0}, pending
    assert codec.to_dict(await alice.call("plan.tree", plan_id=plan_id)) == {"nodes": [], "steps": []}
    explained = await alice.call("plan.explain", plan_id=plan_id)
    assert codec.to_dict(explained)["text"] == f"Plan {plan_id}: action 'act' on project 'proj'\n", explained
    assert codec.to_dict(await alice.call("plan.diff", plan_id=plan_id)) == NO_DIFF
    assert codec.to_dict(await alice.call("plan.artifacts", plan_id=plan_id)) == {"artifacts": []}
    await run.fails(alice.call("plan.prompt", plan_id=plan_id), "INVALID_STATE")
    await run.fails(alice.call("plan.apply", plan_id=plan_id), "INVALID_STATE")
    await run.fails(alice.call("plan.rollback", plan_id=plan_id), "INVALID_STATE")
    await run.fails(alice.call("plan.correct", plan_id=plan_id, node_id="n"), "INVALID_STATE")
    executed = await alice.call("plan.execute", plan_id=plan_id, wait=True)
    assert state_of(executed) == (plan_id, "PLAN_STATE_SUCCEEDED", "PLAN_PHASE_EXECUTE"), executed
    assert plan_of(executed)["progress"] == {"total": 3, "done": 3}, executed
    await run.fails(alice.call("plan.execute", plan_id=plan_id), "INVALID_STATE")
    await run.fails(alice.call("plan.cancel", plan_id=plan_id), "INVALID_STATE")
    for op in (*READ_VIEWS, "plan.prompt"):
        await alice.call(op, plan_id=plan_id)
        await run.fails(alice.call(op, plan_id=MISSING_ID), "NOT_FOUND", "PLAN_NOT_FOUND")
        await run.fails(alice.call(op), "INVALID_PARAMS")
        await run.fails(bob.call(op, plan_id=plan_id), "NOT_FOUND", "PLAN_NOT_FOUND")
    assert codec.to_dict(await alice.call("plan.status", plan_id=plan_id)) == codec.to_dict(executed)
    tree = codec.to_dict(await alice.call("plan.tree", plan_id=plan_id))
    assert [n["id"] for n in tree["nodes"]] == ["d1", "d2", "d3", "d4"], tree
    assert changes(await alice.call("plan.diff", plan_id=plan_id), "files") == CHANGES
    prompt = codec.to_dict(await alice.call("plan.prompt", plan_id=plan_id))
    assert prompt["action_prompt"] == "Write the guide guide.", prompt
    assert prompt["full_text"].endswith("# Task\nWrite the guide guide.\n"), prompt
    artifacts = await alice.call("plan.artifacts", plan_id=plan_id, include_content=True)
    assert changes(artifacts, "artifacts") == CHANGES, artifacts
    assert artifacts.artifacts[0].content == "# The guide\n", artifacts  # type: ignore[attr-defined]
    await run.fails(bob.call("plan.apply", plan_id=plan_id), "NOT_FOUND", "PLAN_NOT_FOUND")
    applied = await alice.call("plan.apply", plan_id=plan_id)
    assert state_of(applied) == (plan_id, "PLAN_STATE_SUCCEEDED", "PLAN_PHASE_APPLY"), applied
    await run.fails(alice.call("plan.apply", plan_id=plan_id), "INVALID_STATE")
    run.note("applied", sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")))
    assert (repo / "docs/guide.md").read_text() == "# The guide\n"
    assert not (repo / "obsolete.txt").exists()
    # Applied: the project's files are what the plan made, nothing differs.
    assert codec.to_dict(await alice.call("plan.diff", plan_id=plan_id)) == NO_DIFF
    (repo / "src/app.py").write_text("edited by a person\n")
    await run.fails(alice.call("plan.rollback", plan_id=plan_id), "INVALID_STATE")
    await run.fails(bob.call("plan.rollback", plan_id=plan_id), "NOT_FOUND", "PLAN_NOT_FOUND")
    rolled = await alice.call("plan.rollback", plan_id=plan_id, force=True)
    assert state_of(rolled) == (plan_id, "PLAN_STATE_ROLLED_BACK", "PLAN_PHASE_APPLY"), rolled
    assert (rolled.restored_paths, rolled.skipped_paths) == ([p for p, _ in CHANGES], []), rolled  # type: ignore[attr-defined]
    assert not (repo / "docs/guide.md").exists()
    assert (repo / "obsolete.txt").exists()
    await run.fails(alice.call("plan.rollback", plan_id=plan_id), "INVALID_STATE")
    for op in ("plan.execute", "plan.apply", "plan.cancel", "plan.rollback"):
        await run.fails(alice.call(op, plan_id=MISSING_ID), "NOT_FOUND", "PLAN_NOT_FOUND")
        await run.fails(alice.call(op), "INVALID_PARAMS")
    await run.fails(
        alice.call("plan.correct", plan_id=MISSING_ID, node_id="n"), "NOT_FOUND", "PLAN_NOT_FOUND"
    )
    events = await run.events(alice, is_state(plan_pb2.PLAN_STATE_ROLLED_BACK), plan_id=plan_id)
    run.note(
        "causal order", [(e.type, e.plan_state_changed.phase, e.plan_state_changed.to_state) for e in events]
    )
    assert {e.plan_id for e in events} == {plan_id}, events
    assert events[0].type == "plan.created", events
    last = await alice.call("plan.status", plan_id=plan_id)
    assert plan_of(last) == plan_of(rolled), (last, rolled)


@scenario("plan.use")
async def plan_use(run: Run) -> None:
    alice, bob, root = run.client(), run.client("bob"), run.client("root")
    await plan_world(run)
    session = await alice.call("session.create", project="proj")
    session_id = session.session.meta.id  # type: ignore[attr-defined]
    await run.fails(
        alice.call("plan.use", action="act", project="proj", inputs={"name": "x"}), "INVALID_PARAMS"
    )
    await run.fails(alice.call("plan.use", action="act"), "INVALID_PARAMS")
    await run.fails(alice.call("plan.use", action="ghost", project="proj"), "NOT_FOUND", "ACTION_NOT_FOUND")
    await run.fails(
        alice.call("plan.use", action="act", project="ghost", inputs=INPUTS), "NOT_FOUND", "PROJECT_NOT_FOUND"
    )
    await run.fails(
        alice.call("plan.use", action="act", project="proj", inputs=INPUTS, session_id=MISSING_ID),
        "NOT_FOUND",
        "SESSION_NOT_FOUND",
    )
    await run.fails(
        alice.call("plan.use", action="act", project="proj", inputs=INPUTS, automation_profile="ghost"),
        "NOT_FOUND",
        "AUTOMATION_PROFILE_NOT_FOUND",
    )
    await run.fails(bob.call("plan.use", action="act", project="proj", namespace="default"), "AUTH_FORBIDDEN")
    plans = [await use(alice), await use(alice, session_id=session_id), await use(alice)]
    cancelled = await alice.call("plan.cancel", plan_id=plans[2], reason="not needed")
    assert state_of(cancelled)[:2] == (plans[2], "PLAN_STATE_CANCELLED"), cancelled
    await run.fails(bob.call("plan.cancel", plan_id=plans[0]), "NOT_FOUND", "PLAN_NOT_FOUND")
    await run.fails(bob.call("plan.execute", plan_id=plans[0]), "NOT_FOUND", "PLAN_NOT_FOUND")
    # /use in a session starts a plan of the session.
    told = await alice.call(
        "session.tell", session_id=session_id, content="/use act name=told word=w title=Told"
    )
    (reply,) = told.replies  # type: ignore[attr-defined]
    assert reply.plan_id, reply
    plans.append(reply.plan_id)
    told_plan = plan_of(await alice.call("plan.status", plan_id=reply.plan_id))
    assert (told_plan["session_id"], told_plan["inputs"]) == (
        session_id,
        {"name": "told", "word": "w", "title": "Told"},
    ), told_plan
    # Newest first.
    page = await alice.call("plan.list", page_size=2)
    assert (ids_of(page), bool(page.next_page_token)) == ([plans[3], plans[2]], True), page  # type: ignore[attr-defined]
    rest = await alice.call("plan.list", page_size=2, page_token=page.next_page_token)  # type: ignore[attr-defined]
    assert (ids_of(rest), rest.next_page_token) == ([plans[1], plans[0]], ""), rest  # type: ignore[attr-defined]
    of_session = await alice.call("plan.list", session_id=session_id)
    assert ids_of(of_session) == [plans[3], plans[1]], of_session
    gone = await alice.call("plan.list", state="PLAN_STATE_CANCELLED", project="proj")
    assert ids_of(gone) == [plans[2]], gone
    await run.fails(alice.call("plan.list", page_token=FORGED_TOKEN), "INVALID_PARAMS")
    await run.fails(alice.call("plan.list", page_size=-1), "INVALID_PARAMS")
    await run.fails(bob.call("plan.list", namespace="default"), "AUTH_FORBIDDEN")
    # A plan in ``other`` too, so root lists both namespaces' and bob only his.
    theirs = folder(run, "theirs")
    await bob.call(
        "resource.add", namespace="other", name="repo", spec={"type": "directory", "path": str(theirs)}
    )
    await bob.call("project.add", namespace="other", name="proj", spec={"resources": ["repo"]})
    action = {"actor": "scripted", "steps": STEPS, "inputs_schema": SCHEMA}
    await bob.call("action.add", namespace="other", name="act", spec=action)
    await use(bob, namespace="other")
    await root_lists(run, "plan.list")
    shown = await root.call("plan.status", plan_id=plans[0])
    assert state_of(shown) == (plans[0], "PLAN_STATE_PENDING", "PLAN_PHASE_STRATEGIZE"), shown


@scenario("plan.correct")
async def plan_correct(run: Run) -> None:
    alice, bob = run.client(), run.client("bob")
    await plan_world(run)
    plan_id = await use(alice)
    await alice.call("plan.execute", plan_id=plan_id, wait=True)
    tree = await alice.call("plan.tree", plan_id=plan_id)
    node = next(n for n in tree.nodes if "create" in n.step_ids)  # type: ignore[attr-defined]
    node_id = node.id
    await run.fails(alice.call("plan.correct", plan_id=plan_id), "INVALID_PARAMS")
    await run.fails(alice.call("plan.correct", plan_id=plan_id, node_id="ghost"), "INVALID_PARAMS")
    await run.fails(bob.call("plan.correct", plan_id=plan_id, node_id=node_id), "NOT_FOUND", "PLAN_NOT_FOUND")
    override = {"step_id": "create", "args": {"path": "docs/other.md", "content": "other\n"}}
    corrected = await alice.call(
        "plan.correct", plan_id=plan_id, node_id=node_id, text="write other.md", overrides=[override]
    )
    assert state_of(corrected) == (plan_id, "PLAN_STATE_PENDING", "PLAN_PHASE_EXECUTE"), corrected
    correction = corrected.node  # type: ignore[attr-defined]
    # The correction takes the corrected decision's place under its parent.
    assert (correction.parent_id, correction.correction) == (node.parent_id, "write other.md"), correction
    assert "docs/other.md" in correction.choice, correction
    executed = await alice.call("plan.execute", plan_id=plan_id, wait=True)
    assert state_of(executed) == (plan_id, "PLAN_STATE_SUCCEEDED", "PLAN_PHASE_EXECUTE"), executed
    for op in ("plan.tree", "plan.explain", "plan.prompt", "plan.artifacts"):
        await alice.call(op, plan_id=plan_id)
    tree = await alice.call("plan.tree", plan_id=plan_id)
    superseded = {n.id for n in tree.nodes if n.superseded}  # type: ignore[attr-defined]
    assert node_id in superseded, tree
    assert correction.id not in superseded, tree
    prompt = await alice.call("plan.prompt", plan_id=plan_id)
    assert "write other.md" in list(prompt.corrections), prompt  # type: ignore[attr-defined]
    artifacts = await alice.call("plan.artifacts", plan_id=plan_id)
    assert "docs/other.md" in {a.path for a in artifacts.artifacts}, artifacts  # type: ignore[attr-defined]


@scenario("plan.outcomes")
async def plan_outcomes(run: Run) -> None:
    """Failures a plan records rather than raises: budget, tools, validations, invariants."""
    alice = run.client()
    await plan_world(run)
    await alice.call("tool.add", name="pricey", spec={"argv": ["true"], "cost": 1.0})
    await alice.call(
        "automation_profile.add", name="poor", spec={"allowed_tools": ["pricey"], "cost_budget": 0.5}
    )
    await alice.call("automation_profile.add", name="deny", spec={})
    # The action's own profile allows the tool, within a budget its price crosses; a profile
    # picked at plan.use only narrows it (deny: the tool may not run at all).
    pay = {
        "actor": "scripted",
        "steps": [{"id": "pay", "tool": "pricey", "args": {}}],
        "automation_profile": "poor",
    }
    await alice.call("action.add", name="pay", spec=pay)
    await alice.call("automation_profile.add", name="short", spec={"max_steps": 1})
    outcomes = []
    for action, profile in [("pay", "poor"), ("pay", "deny"), ("act", "short")]:
        plan_id = await use(alice, action=action, automation_profile=profile)
        await alice.call("plan.execute", plan_id=plan_id, wait=True)
        await run.fails(alice.call("plan.apply", plan_id=plan_id), "INVALID_STATE")
        outcomes.append(plan_id)
    await alice.call("validation.add", name="no-new", spec={"regex": {"pattern": "new", "must_match": False}})
    await alice.call("invariant.add", name="one", spec={"max_files_changed": {"limit": 1}})
    checked = {"actor": "scripted", "steps": STEPS, "inputs_schema": SCHEMA}
    await alice.call("action.add", name="validated", spec={**checked, "validations": ["no-new"]})
    await alice.call("action.add", name="guarded", spec={**checked, "invariants": ["one"]})
    failing = await use(alice, action="validated")
    await alice.call("plan.execute", plan_id=failing, wait=True)
    await run.fails(alice.call("plan.apply", plan_id=failing), "INVALID_STATE")
    refused = await use(alice, action="guarded")
    await alice.call("plan.execute", plan_id=refused, wait=True)
    await run.fails(alice.call("plan.apply", plan_id=refused), "INVALID_STATE")
    recorded = []
    for plan_id in [*outcomes, failing, refused]:
        status = await alice.call("plan.status", plan_id=plan_id)
        run.note("last error", status.plan.last_error.code)  # type: ignore[attr-defined]
        recorded.append((status.plan.state, status.plan.last_error.code))  # type: ignore[attr-defined]
    failed = plan_pb2.PLAN_STATE_FAILED
    assert recorded == [
        (failed, "BUDGET_EXCEEDED"),
        (failed, "tool_not_allowed"),
        (failed, "BUDGET_EXCEEDED"),
        (failed, "validation_failed"),
        # An invariant refuses the apply; the executed plan stays succeeded.
        (plan_pb2.PLAN_STATE_SUCCEEDED, "INVALID_STATE"),
    ], recorded
    events = await run.events(alice, lambda e: e.type == "plan.error", plan_id=refused)
    run.note("refused apply", [e.type for e in events])
    assert events[-1].plan_error.error.code == recorded[-1][1], events


@scenario("events")
async def events_scenario(run: Run) -> None:
    alice, bob, root = run.client(), run.client("bob"), run.client("root")
    first = await alice.call("session.create", title="a")
    second = await alice.call("session.create", title="b")
    theirs = await bob.call("session.create", namespace="other", title="c")
    for session in (first, second):
        await alice.call("session.tell", session_id=session.session.meta.id, content="/help")  # type: ignore[attr-defined]
    await bob.call("session.tell", session_id=theirs.session.meta.id, content="hi")  # type: ignore[attr-defined]
    # Four events a tell: session.turn_started, two session.message, session.turn_completed.
    everything = await run.events(root, lambda e: e.sequence == 12)
    # Every namespace's, from the first, gap-free.
    assert [e.sequence for e in everything] == list(range(1, 13)), everything
    assert {e.namespace for e in everything} == {"default", "other"}, everything

    def among(keep: Callable[[events_pb2.Event], bool]) -> list[events_pb2.Event]:
        """The events of ``everything`` a filter keeps, in order."""
        return [e for e in everything if keep(e)]

    mine = await run.events(alice, lambda e: e.sequence == 8)
    assert mine == among(lambda e: e.namespace == "default" and e.sequence <= 8), mine
    (theirs_first,) = await run.events(bob, lambda e: True)
    assert theirs_first == among(lambda e: e.namespace == "other")[0], theirs_first
    second_id = second.session.meta.id  # type: ignore[attr-defined]
    (of_second,) = await run.events(alice, lambda e: True, session_id=second_id)
    assert of_second == among(lambda e: e.session_id == second_id)[0], of_second
    (after,) = await run.events(alice, lambda e: True, after_sequence=everything[1].sequence)
    assert after == among(lambda e: e.namespace == "default" and e.sequence > everything[1].sequence)[0], (
        after
    )
    (message,) = await run.events(root, lambda e: True, namespace="other", event_type=["session.message"])
    assert (message.namespace, message.type, message.session_id) == (
        "other",
        "session.message",
        theirs.session.meta.id,  # type: ignore[attr-defined]
    ), message
    assert message.session_message.message.content == "hi", message
    await run.fails(run.events(alice, lambda e: True, event_type=["bogus"]), "INVALID_PARAMS")
    await run.fails(run.events(alice, lambda e: True, after_sequence=-1), "INVALID_PARAMS")
    await run.fails(run.events(bob, lambda e: True, namespace="default"), "AUTH_FORBIDDEN")
    await run.fails(run.events(run.client(None), lambda e: True), "AUTH_REQUIRED")
    await run.fails(run.events(run.client("alice", acp_version="0.9"), lambda e: True), "VERSION_MISMATCH")
