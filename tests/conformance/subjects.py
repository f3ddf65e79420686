"""The positive half of the auth matrix: each principal allowed in ``default`` runs every
operation where it can succeed, and the answer is checked.

``own_subjects`` prepares, per principal, a subject of its own for every operation that
consumes one (an entry to update and one to remove, a draft plan to execute and one to
cancel, an executed plan to apply, a closed session to resume...), so no call finds its
subject already changed by an earlier one whatever the catalog's order. ``check_answer``
holds what a success must say for each operation; an operation it does not know fails the
matrix, so a new operation gets a check when it is added to the proto.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cleveragents.acp.client.acp_client import request_for
from cleveragents.acp.contract import codec, versions
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.envelope import new_request_id
from cleveragents.acp.contract.transport import CallOptions
from tests.conformance import approvals
from tests.conformance.harness import Run
from tests.conformance.scenarios import REGISTRY_KINDS, REGISTRY_VERBS, entries, folder, use
from tests.conformance.webhook_cases import WEBHOOK_CHECKS, webhook_subjects
from tests.facade.plans.helpers import INPUTS
from tests.fake_openai import FakeOpenAI, Hang
from tests.registry_specs import registry_spec

Params = dict[str, Any]
Data = dict[str, Any]
World = dict[str, Any]
# Imported sessions keep the document's id: one per principal (ULIDs, not of this run).
IMPORTED_IDS = {
    "alice": "01HZZZZZZZZZZZZZZZZZZZZZZA",
    "root": "01HZZZZZZZZZZZZZZZZZZZZZZB",
    "prior": "01HZZZZZZZZZZZZZZZZZZZZZZC",
    "current": "01HZZZZZZZZZZZZZZZZZZZZZZD",
}


_SILENT: list[FakeOpenAI] = []


def silent_model() -> FakeOpenAI:
    """One model server for the test process that takes every call and never answers (in
    a daemon thread of its own: it outlives each backend, and dies with the process). A served
    backend must allow its ``base_url`` with ``--model-endpoint``."""
    if not _SILENT:
        server = FakeOpenAI().start_in_thread()
        server.repeat = Hang(3600)
        _SILENT.append(server)
    return _SILENT[0]


async def own_subjects(run: Run, world: dict[str, Any], who: str) -> dict[str, Params]:
    """Per operation, the request fields naming ``who``'s own subject, made (by alice, in
    ``default``) in the state the operation needs."""
    alice = run.client()
    own: dict[str, Params] = {}
    for kind in REGISTRY_KINDS:
        own[f"{kind}.add"] = {"name": f"{who}-add"}
        for verb in ("update", "remove"):
            name = f"{who}-{verb}"
            await alice.call(f"{kind}.add", name=name, spec=registry_spec(kind, world["folder"]))
            own[f"{kind}.{verb}"] = {"name": name}
        own[f"{kind}.update"].update(description="changed", update_mask="description")
    own["plan.use"] = {"inputs": INPUTS}
    own["plan.execute"] = {"plan_id": await use(alice), "wait": True}
    own["plan.cancel"] = {"plan_id": await use(alice)}
    # Plans applied to a project of their own: an apply changes the project's files, and
    # the read views of the world's plan (diff, artifacts) compare with them.
    repo = folder(run, f"{who}-repo")
    await alice.call("resource.add", name=f"{who}-repo", spec={"type": "directory", "path": str(repo)})
    await alice.call("project.add", name=f"{who}-proj", spec={"resources": [f"{who}-repo"]})
    for name in ("plan.apply", "plan.rollback", "plan.correct"):
        plan_id = await use(alice, project=f"{who}-proj")
        await alice.call("plan.execute", plan_id=plan_id, wait=True)
        own[name] = {"plan_id": plan_id}
    await alice.call("plan.apply", plan_id=own["plan.rollback"]["plan_id"])
    tree = await alice.call("plan.tree", plan_id=own["plan.correct"]["plan_id"])
    own["plan.correct"]["node_id"] = tree.nodes[0].id  # type: ignore[attr-defined]
    # A queued turn to cancel: behind a turn whose model call never answers.
    await alice.call(
        "actor.add",
        name=f"{who}-slow",
        spec={"provider": "openai", "model": "m", "base_url": silent_model().base_url},
    )
    slow = (await alice.call("session.create", orchestrator=f"{who}-slow")).session.meta.id  # type: ignore[attr-defined]
    await alice.call("session.tell", session_id=slow, content="Q1", background=True)
    queued = await alice.call("session.tell", session_id=slow, content="Q2", background=True)
    own["session.cancel_turn"] = {"session_id": slow, "turn_id": queued.turn.id}  # type: ignore[attr-defined]
    closed = await alice.call("session.create", project="proj")
    await alice.call("session.tell", session_id=closed.session.meta.id, content="/close")  # type: ignore[attr-defined]
    own["session.resume"] = {"session_id": closed.session.meta.id}  # type: ignore[attr-defined]
    # A session of its own to configure: the world's keeps the sources context.inspect reads.
    configured = await alice.call("session.create", project="proj")
    own["context.set"] = {"session_id": configured.session.meta.id}  # type: ignore[attr-defined]
    renamed = await alice.call("session.create", project="proj")
    own["session.update"] = {
        "session_id": renamed.session.meta.id,  # type: ignore[attr-defined]
        "session": {"title": f"{who} renamed"},
        "update_mask": "title",
    }
    doomed = await alice.call("session.create")
    own["session.delete"] = {"session_id": doomed.session.meta.id}  # type: ignore[attr-defined]
    document = world["document"]
    meta = {**document["session"]["meta"], "id": IMPORTED_IDS[who]}
    own["session.import"] = {"document": {**document, "session": {**document["session"], "meta": meta}}}
    own["events.subscribe"] = {"after_sequence": 0}
    own.update(await webhook_subjects(alice, who))
    own["approval.answer"] = {
        "approval_id": await approvals.waiting_approval(alice),
        "answer": approvals.ALLOW_ONCE,
    }
    return own


async def answer(
    run: Run, op: Operation, params: Params, principal: str | None, acp_version: str | None = None
) -> Data:
    """The successful answer of a call as JSON; of a stream, its first item."""
    c = run.client(principal, acp_version=acp_version)
    if op.server_streaming:
        options = CallOptions(acp_version=c.acp_version, token=c.token, request_id=new_request_id())
        items = await c.transport.open_stream(op, request_for(op, params, {}), options)
        try:
            first = await anext(items)
        finally:
            await items.aclose()  # type: ignore[attr-defined]
        return codec.to_dict(first)
    return codec.to_dict(await c.call(op.name, params))


def plan_in(data: Data, params: Params, state: str, phase: str) -> bool:
    plan = data["plan"]
    return bool(plan["meta"]["id"] == params["plan_id"] and (plan["state"], plan["phase"]) == (state, phase))


def session_in(data: Data, params: Params, state: str) -> bool:
    session = data["session"]
    return bool(session["meta"]["id"] == params["session_id"] and session["state"] == state)


def registry_answer(op: Operation, params: Params, data: Data, world: World) -> bool:
    if op.verb == "list":
        return world["name"] in {e["name"] for e in entries(data)}
    entry = data[op.group]
    revision = 2 if op.verb == "update" else 1
    return bool(
        (entry["name"], entry["meta"]["namespace"], entry["revision"])
        == (params["name"], "default", revision)
    )


def listed(data: Data, entity_id: str) -> bool:
    return any(item["meta"]["id"] == entity_id for item in entries(data))


def included(data: Data) -> set[str]:
    return {i["id"] for i in data["items"] if i["disposition"] == "ITEM_DISPOSITION_INCLUDED"}


Check = Callable[[Params, Data, World], bool]
EXECUTED, APPLY = "PLAN_PHASE_EXECUTE", "PLAN_PHASE_APPLY"
SUCCEEDED = "PLAN_STATE_SUCCEEDED"
ACTIVE = "SESSION_STATE_ACTIVE"

# What a success answers, per operation outside the registries (``registry_answer``).
CHECKS: dict[str, Check] = {
    "meta.version": lambda p, d, w: d["current_version"] == versions.CURRENT,
    "events.ticket": lambda p, d, w: d["ticket"].startswith("acpt_") and bool(d["expire_time"]),
    "events.subscribe": lambda p, d, w: d["event"]["sequence"] == "1",
    "session.create": lambda p, d, w: d["session"]["state"] == ACTIVE,
    "session.list": lambda p, d, w: listed(d, w["session_id"]),
    "session.show": lambda p, d, w: session_in(d, p, ACTIVE),
    "session.resume": lambda p, d, w: session_in(d, p, ACTIVE),
    "session.update": lambda p, d, w: (
        session_in(d, p, ACTIVE)
        and d["session"]["title"] == p["session"]["title"]
        and d["session"]["revision"] == 2
    ),
    "session.delete": lambda p, d, w: d == {"session_id": p["session_id"]},
    "session.export": lambda p, d, w: d["document"]["session"]["meta"]["id"] == p["session_id"],
    "session.import": lambda p, d, w: d["session"]["meta"]["id"] == p["document"]["session"]["meta"]["id"],
    "session.tell": lambda p, d, w: d["message"]["content"] == p["content"] and bool(d["replies"]),
    "session.turn": lambda p, d, w: (
        d["turn"]["id"] == p["turn_id"]
        and d["turn"]["state"] == "TURN_STATE_SUCCEEDED"
        and len(d["messages"]) == 2
    ),
    "session.cancel_turn": lambda p, d, w: (
        d["turn"]["id"] == p["turn_id"] and d["turn"]["state"] == "TURN_STATE_CANCELLED"
    ),
    # The world's folder holds the resource ``base``, which projects ``w`` (and a principal's own) name.
    "project.resolve": lambda p, d, w: (
        (d["resource"], d["relative_path"]) == ("base", "sub") and "base" in d["project"]["spec"]["resources"]
    ),
    "context.show": lambda p, d, w: [s["resource"] for s in d["config"]["sources"]] == ["repo"],
    "context.set": lambda p, d, w: d["config"]["token_budget"] == p["config"]["token_budget"],
    "context.inspect": lambda p, d, w: d["item"]["id"] == p["item_id"] and bool(d["item"]["content"]),
    "context.simulate": lambda p, d, w: (
        "file:repo/README.md" in included(d) and d["total_tokens"] == sum(i["tokens"] for i in d["items"])
    ),
    "plan.use": lambda p, d, w: (d["plan"]["action"], d["plan"]["project"]) == (p["action"], p["project"]),
    "plan.list": lambda p, d, w: listed(d, w["plan_id"]),
    "plan.status": lambda p, d, w: plan_in(d, p, SUCCEEDED, EXECUTED),
    "plan.execute": lambda p, d, w: plan_in(d, p, SUCCEEDED, EXECUTED),
    "plan.cancel": lambda p, d, w: (
        d["plan"]["meta"]["id"] == p["plan_id"] and d["plan"]["state"] == "PLAN_STATE_CANCELLED"
    ),
    "plan.apply": lambda p, d, w: plan_in(d, p, SUCCEEDED, APPLY),
    "plan.rollback": lambda p, d, w: plan_in(d, p, "PLAN_STATE_ROLLED_BACK", APPLY),
    # The correction is a new decision node; the plan waits to be executed again.
    "plan.correct": lambda p, d, w: (
        plan_in(d, p, "PLAN_STATE_PENDING", EXECUTED) and d["node"]["id"] not in ("", p["node_id"])
    ),
    "plan.tree": lambda p, d, w: bool(d["nodes"]),
    "plan.explain": lambda p, d, w: p["plan_id"] in d["text"],
    "plan.diff": lambda p, d, w: "docs/guide.md" in {f["path"] for f in d["files"]},
    "plan.artifacts": lambda p, d, w: "docs/guide.md" in {a["path"] for a in d["artifacts"]},
    "plan.prompt": lambda p, d, w: d["action_prompt"] == "Write the guide guide.",
    **WEBHOOK_CHECKS,
    "approval.list": lambda p, d, w: w["approval_id"] in {a["id"] for a in d["approvals"]},
    "approval.show": lambda p, d, w: (
        d["approval"]["id"] == p["approval_id"] and d["approval"]["state"] == "APPROVAL_STATE_PENDING"
    ),
    "approval.answer": lambda p, d, w: (
        d["approval"]["id"] == p["approval_id"] and d["approval"]["state"] == "APPROVAL_STATE_ALLOWED"
    ),
}


async def check_answer(run: Run, op: Operation, params: Params, data: Data, world: World) -> None:
    """The success answers about the subject asked for, in the state the call leaves it; a
    removed subject is gone."""
    if op.group in REGISTRY_KINDS and op.verb in REGISTRY_VERBS:
        assert registry_answer(op, params, data, world), (op.name, params, data)
    else:
        assert op.name in CHECKS, f"{op.name}: no check of its answer in tests/conformance/subjects.py"
        assert CHECKS[op.name](params, data, world), (op.name, params, data)
    if op.name == "approval.answer":
        # The answer resumed a plan: later answers (plan.list) see it once it ended.
        await approvals.settled(run, data["approval"]["plan_id"])
    if op.verb in ("remove", "delete"):
        shown = f"{op.group}.show"
        subject: dict[str, Any] = {key: params[key] for key in ("name", "session_id") if key in params}
        await run.fails(run.client().call(shown, subject), "NOT_FOUND")
    run.answered(op)
