"""The scenarios of the contract suite, written once against ``ACPClient``.

Each takes a ``Run`` (recording clients over one backend) and drives the operations a user
would, wrong inputs and other namespaces included; ``test_scenarios`` runs each on the
three transports and compares the traces. Together they call every operation of the
catalog and provoke every error an operation can answer (``test_coverage`` checks both).
Principals (``tests.server_process.Tokens``): alice uses ``default``, bob ``other``, root all.
"""

from __future__ import annotations

import pathlib
from collections.abc import Callable
from typing import Any

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.contract import catalog, codec
from cleveragents.acp.v1 import events_pb2, plan_pb2
from tests.conformance.harness import Run, Scenario
from tests.facade.plans.helpers import INPUTS, SCHEMA, STEPS, write_tree
from tests.registry_specs import registry_spec

SCENARIOS: dict[str, Scenario] = {}
MISSING_ID = "01J00000000000000000000000"
FORGED_TOKEN = "Zm9yZ2Vk"
REGISTRY_VERBS = frozenset({"list", "show", "add", "update", "remove"})
# A registry kind is an operation group with exactly the five registry verbs.
REGISTRY_KINDS = sorted(
    group
    for group in {op.group for op in catalog.OPERATIONS.values()}
    if {op.verb for op in catalog.OPERATIONS.values() if op.group == group} == REGISTRY_VERBS
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


def registry_scenario(kind: str) -> Scenario:
    async def run_kind(run: Run) -> None:
        alice, bob = run.client("alice"), run.client("bob")
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
        await bob.call(f"{kind}.add", namespace="other", name="e1", spec=spec)
        await alice.call(f"{kind}.show", name="e1")
        await run.fails(alice.call(f"{kind}.show", name="nope"), "NOT_FOUND", f"{kind.upper()}_NOT_FOUND")
        await run.fails(alice.call(f"{kind}.show"), "INVALID_PARAMS")
        await run.fails(bob.call(f"{kind}.show", namespace="default", name="e1"), "AUTH_FORBIDDEN")
        first = await alice.call(f"{kind}.list", page_size=2)
        token = first.next_page_token  # type: ignore[attr-defined]
        assert token
        await alice.call(f"{kind}.list", page_size=2, page_token=token)
        await run.fails(
            alice.call(f"{kind}.list", page_size=2, page_token=token, labels={"team": "a"}), "INVALID_PARAMS"
        )
        await alice.call(f"{kind}.list", labels={"team": "a"})
        await run.fails(alice.call(f"{kind}.list", page_token=FORGED_TOKEN), "INVALID_PARAMS")
        await run.fails(alice.call(f"{kind}.list", page_size=-1), "INVALID_PARAMS")
        await run.fails(bob.call(f"{kind}.list", namespace="default"), "AUTH_FORBIDDEN")
        await root_lists(run, f"{kind}.list")
        await alice.call(
            f"{kind}.update", name="e1", revision=1, description="changed", update_mask="description"
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
        await alice.call(f"{kind}.remove", name="e3")
        await run.fails(alice.call(f"{kind}.remove", name="e3"), "NOT_FOUND", f"{kind.upper()}_NOT_FOUND")
        await run.fails(alice.call(f"{kind}.remove"), "INVALID_PARAMS")
        await run.fails(bob.call(f"{kind}.remove", namespace="default", name="e2"), "AUTH_FORBIDDEN")
        await alice.call(f"{kind}.list")

    return run_kind


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
    await alice.call("actor.list", labels={"builtin": "true"})


@scenario("meta")
async def meta(run: Run) -> None:
    await run.client(None).call("meta.version")
    await run.client("bob").call("meta.version")
    await run.fails(run.client(None, acp_version="1.0").call("meta.version"), "VERSION_MISMATCH")
    await run.fails(run.client(None, acp_version="2.0").call("meta.version"), "VERSION_MISMATCH")
    await run.fails(run.client("alice", acp_version="1.0").call("plan.list"), "VERSION_MISMATCH")
    await run.fails(run.client(None).call("session.list"), "AUTH_REQUIRED")
    await run.fails(run.client("acp_not-a-token").call("session.list"), "AUTH_REQUIRED")


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
    await alice.call("session.create", title="no project")
    await run.fails(alice.call("session.create", orchestrator="ghost"), "INVALID_PARAMS")
    await run.fails(alice.call("session.create", project="ghost"), "INVALID_PARAMS")
    await run.fails(alice.call("session.create", labels={"bad key": "x"}), "INVALID_PARAMS")
    await run.fails(bob.call("session.create", namespace="default"), "AUTH_FORBIDDEN")
    await bob.call("session.create", namespace="other", title="bob's")

    page = await alice.call("session.list", page_size=2)
    await alice.call("session.list", page_size=2, page_token=page.next_page_token)  # type: ignore[attr-defined]
    await run.fails(
        alice.call("session.list", page_size=2, page_token=page.next_page_token, project="web"),  # type: ignore[attr-defined]
        "INVALID_PARAMS",
    )
    await alice.call("session.list", project="web", actor="orchestrator", state="SESSION_STATE_ACTIVE")
    await run.fails(alice.call("session.list", page_token=FORGED_TOKEN), "INVALID_PARAMS")
    await run.fails(alice.call("session.list", page_size=-1), "INVALID_PARAMS")
    await run.fails(bob.call("session.list", namespace="default"), "AUTH_FORBIDDEN")
    await root_lists(run, "session.list")

    first = ids[0]
    await alice.call("session.show", session_id=first)
    await run.fails(alice.call("session.show", session_id=MISSING_ID), "NOT_FOUND", "SESSION_NOT_FOUND")
    await run.fails(alice.call("session.show"), "INVALID_PARAMS")
    await run.fails(bob.call("session.show", session_id=first), "NOT_FOUND", "SESSION_NOT_FOUND")

    await alice.call("session.tell", session_id=first, content="/help")
    await alice.call("session.tell", session_id=first, content="hello there")
    await run.fails(alice.call("session.tell", session_id=first), "INVALID_PARAMS")
    await run.fails(alice.call("session.tell", session_id=first, content="x" * 100_001), "INVALID_PARAMS")
    await run.fails(
        alice.call("session.tell", session_id=MISSING_ID, content="hi"), "NOT_FOUND", "SESSION_NOT_FOUND"
    )
    await run.fails(
        bob.call("session.tell", session_id=first, content="hi"), "NOT_FOUND", "SESSION_NOT_FOUND"
    )
    await run.fails(alice.call("session.resume", session_id=first), "INVALID_STATE")
    await alice.call("session.tell", session_id=first, content="/close")
    await run.fails(alice.call("session.tell", session_id=first, content="hi"), "INVALID_STATE")
    await run.fails(bob.call("session.resume", session_id=first), "NOT_FOUND", "SESSION_NOT_FOUND")
    await run.fails(alice.call("session.resume", session_id=MISSING_ID), "NOT_FOUND", "SESSION_NOT_FOUND")
    await run.fails(alice.call("session.resume"), "INVALID_PARAMS")
    await alice.call("session.resume", session_id=first)
    await alice.call("session.list", state="SESSION_STATE_CLOSED")

    # An orchestrator that cannot orchestrate: refused, nothing stored.
    await alice.call("actor.add", name="plain", spec={"provider": "scripted"})
    odd = await alice.call("session.create", orchestrator="plain")
    await run.fails(alice.call("session.tell", session_id=odd.session.meta.id, content="hi"), "INVALID_STATE")  # type: ignore[attr-defined]
    await run.fails(alice.call("actor.remove", name="plain"), "INVALID_STATE")

    await run.fails(bob.call("session.delete", session_id=first), "NOT_FOUND", "SESSION_NOT_FOUND")
    await alice.call("session.delete", session_id=ids[2])
    await run.fails(alice.call("session.delete", session_id=ids[2]), "NOT_FOUND", "SESSION_NOT_FOUND")
    await run.fails(alice.call("session.delete"), "INVALID_PARAMS")
    await alice.call("session.show", session_id=first)
    events = await run.events(
        alice,
        lambda e: e.session_message.message.content.startswith("Closed") or e.sequence >= 6,
        session_id=first,
    )
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
    await run.fails(alice.call("session.export", session_id=MISSING_ID), "NOT_FOUND", "SESSION_NOT_FOUND")
    await run.fails(alice.call("session.export"), "INVALID_PARAMS")
    await run.fails(bob.call("session.export", session_id=session_id), "NOT_FOUND", "SESSION_NOT_FOUND")

    await run.fails(
        alice.call("session.import", document=document), "ALREADY_EXISTS", "SESSION_ALREADY_EXISTS"
    )
    await alice.call("session.import", document=document, new_id=True)
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
    await root.call("session.import", document=without_context, new_id=True, namespace="other")
    await alice.call("session.delete", session_id=session_id)
    await alice.call("session.import", document=document)
    await alice.call("session.show", session_id=session_id)


@scenario("context")
async def context(run: Run) -> None:
    alice, bob = run.client(), run.client("bob")
    source = folder(run, "web")
    await alice.call("resource.add", name="web", spec={"type": "directory", "path": str(source)})
    await alice.call("project.add", name="web", spec={"resources": ["web"]})
    await alice.call("skill.add", name="tone", spec={"instructions": "Be kind and brief."})
    created = await alice.call("session.create", project="web")
    session_id = created.session.meta.id  # type: ignore[attr-defined]

    await alice.call("context.show", project="web")
    await alice.call("context.show", session_id=session_id)
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
    await alice.call("context.set", project="web", config={"sources": [{"resource": "web"}]})
    await alice.call("context.set", session_id=session_id, config=config)
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
    await alice.call("context.show", session_id=session_id)
    await run.fails(alice.call("skill.remove", name="tone"), "INVALID_STATE")

    await alice.call("context.inspect", session_id=session_id, item_id="file:web/README.md")
    await alice.call("context.inspect", session_id=session_id, item_id="skill:tone")
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

    await alice.call("context.simulate", session_id=session_id, prompt="Summarize the project.")
    await alice.call("context.simulate", project="web", prompt="x", token_budget=3)
    await run.fails(alice.call("context.simulate", session_id=session_id, token_budget=-1), "INVALID_PARAMS")
    await run.fails(alice.call("context.simulate", project="ghost"), "NOT_FOUND", "PROJECT_NOT_FOUND")
    await run.fails(alice.call("context.simulate", session_id=MISSING_ID), "NOT_FOUND", "SESSION_NOT_FOUND")
    await run.fails(bob.call("context.simulate", session_id=session_id), "NOT_FOUND", "SESSION_NOT_FOUND")


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


@scenario("plan.lifecycle")
async def plan_lifecycle(run: Run) -> None:
    alice, bob = run.client(), run.client("bob")
    repo = await plan_world(run)
    plan_id = await use(alice)
    for op in READ_VIEWS:
        await alice.call(op, plan_id=plan_id)
    await run.fails(alice.call("plan.prompt", plan_id=plan_id), "INVALID_STATE")
    await run.fails(alice.call("plan.apply", plan_id=plan_id), "INVALID_STATE")
    await run.fails(alice.call("plan.rollback", plan_id=plan_id), "INVALID_STATE")
    await run.fails(alice.call("plan.correct", plan_id=plan_id, node_id="n"), "INVALID_STATE")
    await alice.call("plan.execute", plan_id=plan_id, wait=True)
    await run.fails(alice.call("plan.execute", plan_id=plan_id), "INVALID_STATE")
    await run.fails(alice.call("plan.cancel", plan_id=plan_id), "INVALID_STATE")
    for op in (*READ_VIEWS, "plan.prompt"):
        await alice.call(op, plan_id=plan_id)
        await run.fails(alice.call(op, plan_id=MISSING_ID), "NOT_FOUND", "PLAN_NOT_FOUND")
        await run.fails(alice.call(op), "INVALID_PARAMS")
        await run.fails(bob.call(op, plan_id=plan_id), "NOT_FOUND", "PLAN_NOT_FOUND")
    await alice.call("plan.artifacts", plan_id=plan_id, include_content=True)
    await run.fails(bob.call("plan.apply", plan_id=plan_id), "NOT_FOUND", "PLAN_NOT_FOUND")
    await alice.call("plan.apply", plan_id=plan_id)
    await run.fails(alice.call("plan.apply", plan_id=plan_id), "INVALID_STATE")
    run.note("applied", sorted(p.relative_to(repo).as_posix() for p in repo.rglob("*")))
    await alice.call("plan.diff", plan_id=plan_id)
    (repo / "src/app.py").write_text("edited by a person\n")
    await run.fails(alice.call("plan.rollback", plan_id=plan_id), "INVALID_STATE")
    await run.fails(bob.call("plan.rollback", plan_id=plan_id), "NOT_FOUND", "PLAN_NOT_FOUND")
    await alice.call("plan.rollback", plan_id=plan_id, force=True)
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
    await alice.call("plan.status", plan_id=plan_id)


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
    await alice.call("plan.cancel", plan_id=plans[2], reason="not needed")
    await run.fails(bob.call("plan.cancel", plan_id=plans[0]), "NOT_FOUND", "PLAN_NOT_FOUND")
    await run.fails(bob.call("plan.execute", plan_id=plans[0]), "NOT_FOUND", "PLAN_NOT_FOUND")
    # /use in a session starts a plan of the session.
    await alice.call("session.tell", session_id=session_id, content="/use act name=told word=w")
    page = await alice.call("plan.list", page_size=2)
    await alice.call("plan.list", page_size=2, page_token=page.next_page_token)  # type: ignore[attr-defined]
    await alice.call("plan.list", session_id=session_id)
    await alice.call("plan.list", state="PLAN_STATE_CANCELLED", project="proj")
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
    await root.call("plan.status", plan_id=plans[0])


@scenario("plan.correct")
async def plan_correct(run: Run) -> None:
    alice, bob = run.client(), run.client("bob")
    await plan_world(run)
    plan_id = await use(alice)
    await alice.call("plan.execute", plan_id=plan_id, wait=True)
    tree = await alice.call("plan.tree", plan_id=plan_id)
    node_id = next(n.id for n in tree.nodes if "create" in n.step_ids)  # type: ignore[attr-defined]
    await run.fails(alice.call("plan.correct", plan_id=plan_id), "INVALID_PARAMS")
    await run.fails(alice.call("plan.correct", plan_id=plan_id, node_id="ghost"), "INVALID_PARAMS")
    await run.fails(bob.call("plan.correct", plan_id=plan_id, node_id=node_id), "NOT_FOUND", "PLAN_NOT_FOUND")
    override = {"step_id": "create", "args": {"path": "docs/other.md", "content": "other\n"}}
    await alice.call(
        "plan.correct", plan_id=plan_id, node_id=node_id, text="write other.md", overrides=[override]
    )
    await alice.call("plan.execute", plan_id=plan_id, wait=True)
    for op in ("plan.tree", "plan.explain", "plan.prompt", "plan.artifacts"):
        await alice.call(op, plan_id=plan_id)


@scenario("plan.outcomes")
async def plan_outcomes(run: Run) -> None:
    """Failures a plan records rather than raises: budget, tools, validations, invariants."""
    alice = run.client()
    await plan_world(run)
    await alice.call("tool.add", name="pricey", spec={"argv": ["true"], "cost": 1.0})
    pay = {"actor": "scripted", "steps": [{"id": "pay", "tool": "pricey", "args": {}}]}
    await alice.call("action.add", name="pay", spec=pay)
    await alice.call(
        "automation_profile.add", name="poor", spec={"allowed_tools": ["pricey"], "cost_budget": 0.5}
    )
    await alice.call("automation_profile.add", name="deny", spec={})
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
    for plan_id in [*outcomes, failing, refused]:
        status = await alice.call("plan.status", plan_id=plan_id)
        run.note("last error", status.plan.last_error.code)  # type: ignore[attr-defined]
    events = await run.events(alice, lambda e: e.type == "plan.error", plan_id=refused)
    run.note("refused apply", [e.type for e in events])


@scenario("events")
async def events_scenario(run: Run) -> None:
    alice, bob, root = run.client(), run.client("bob"), run.client("root")
    first = await alice.call("session.create", title="a")
    second = await alice.call("session.create", title="b")
    theirs = await bob.call("session.create", namespace="other", title="c")
    for session in (first, second):
        await alice.call("session.tell", session_id=session.session.meta.id, content="/help")  # type: ignore[attr-defined]
    await bob.call("session.tell", session_id=theirs.session.meta.id, content="hi")  # type: ignore[attr-defined]
    everything = await run.events(root, lambda e: e.sequence == 6)
    await run.events(alice, lambda e: e.sequence == 4)
    await run.events(bob, lambda e: True)
    await run.events(alice, lambda e: True, session_id=second.session.meta.id)  # type: ignore[attr-defined]
    await run.events(alice, lambda e: True, after_sequence=everything[1].sequence)
    await run.events(root, lambda e: True, namespace="other", event_type=["session.message"])
    await run.fails(run.events(alice, lambda e: True, event_type=["bogus"]), "INVALID_PARAMS")
    await run.fails(run.events(alice, lambda e: True, after_sequence=-1), "INVALID_PARAMS")
    await run.fails(run.events(bob, lambda e: True, namespace="default"), "AUTH_FORBIDDEN")
    await run.fails(run.events(run.client(None), lambda e: True), "AUTH_REQUIRED")
    await run.fails(run.events(run.client("alice", acp_version="0.9"), lambda e: True), "VERSION_MISMATCH")
