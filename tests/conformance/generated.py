"""Auth and version conformance, generated from the catalog: a new operation is covered
with no edit here.

Every operation gets a valid request over a small world of entities in namespace ``default``
(``world_request``): its required fields from the world, ``namespace: default`` where the
request has one, and a session as the scope of ``context.*``. Both matrices are scenarios,
so they run on every transport and their traces are compared like the others.
"""

from __future__ import annotations

from typing import Any

from cleveragents.acp.client.acp_client import request_for
from cleveragents.acp.contract import catalog, codec, surface, versions
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.envelope import new_request_id
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.contract.required import required_fields
from cleveragents.acp.contract.transport import CallOptions
from tests.conformance import approvals
from tests.conformance.canonical import Canonicalizer
from tests.conformance.harness import Run
from tests.conformance.scenarios import (
    REGISTRY_KINDS,
    SCENARIOS,
    folder,
    plan_world,
    scenario,
    use,
)
from tests.conformance.subjects import answer, check_answer, own_subjects
from tests.conformance.webhook_cases import WEBHOOK_URL
from tests.registry_specs import registry_spec

AUTH_CODES = frozenset({"AUTH_REQUIRED", "AUTH_FORBIDDEN"})
UNSUPPORTED_VERSIONS = ("2.0", "0.9", "1", "1.0", "1.4", "01.2", "latest")
# The prior minor the server still speaks beside the current one.
PRIOR = versions.SUPPORTED[-1]
# The subjects the version matrix calls each minor on (``own_subjects``' names).
VERSION_SUBJECTS = {PRIOR: "prior", versions.CURRENT: "current"}
IMPORTED_ID = "01HZZZZZZZZZZZZZZZZZZZZZZZ"


async def build_world(run: Run) -> dict[str, Any]:
    """Entities of every kind in ``default``, and the values requests take from them."""
    alice = run.client()
    await plan_world(run)
    base = folder(run, "base")
    await alice.call("resource.add", name="base", spec=registry_spec("resource", base))
    for kind in REGISTRY_KINDS:
        await alice.call(f"{kind}.add", name="w", spec=registry_spec(kind, base))
    session = await alice.call("session.create", project="proj")
    session_id = session.session.meta.id  # type: ignore[attr-defined]
    plan_id = await use(alice)
    await alice.call("plan.execute", plan_id=plan_id, wait=True)
    tree = await alice.call("plan.tree", plan_id=plan_id)
    # After the plan: the log's first event stays one every served minor sees.
    told = await alice.call("session.tell", session_id=session_id, content="/help")
    await approvals.gated_world(run, alice)
    approval_id = await approvals.waiting_approval(alice)
    exported = await alice.call("session.export", session_id=session_id)
    await alice.call("webhook.add", name="w", url=WEBHOOK_URL)
    return {
        "session_id": session_id,
        "turn_id": told.turn.id,  # type: ignore[attr-defined]
        "approval_id": approval_id,
        "answer": approvals.ALLOW_ONCE,
        "plan_id": plan_id,
        "node_id": tree.nodes[0].id,  # type: ignore[attr-defined]
        "name": "w",
        "revision": 1,
        "action": "act",
        "project": "proj",
        "item_id": "file:repo/README.md",
        "content": "/help",
        "session": {"title": "renamed"},
        "update_mask": "title",
        "config": {"token_budget": 100},
        "document": codec.to_dict(exported)["document"],
        "folder": base,
        "path": str(base / "sub"),
        "url": WEBHOOK_URL,
        "from_sequence": 1,
    }


def world_request(op: Operation, world: dict[str, Any]) -> dict[str, Any]:
    fields = op.request_type.DESCRIPTOR.fields_by_name
    params: dict[str, Any] = {}
    for field in required_fields(op.request_type.DESCRIPTOR):
        if field.name == "spec":
            params["spec"] = registry_spec(op.group, world["folder"])
        else:
            params[field.name] = world[field.name]
    if "namespace" in fields:
        params["namespace"] = "default"
    if op.group == "context":
        params["session_id"] = world["session_id"]
    if op.name == "session.import":
        # A fixed id of its own: a copy taking a new id keeps the original's creation
        # instant, and lists in no fixed order beside it.
        document = params["document"]
        params["document"] = {
            **document,
            "session": {**document["session"], "meta": {**document["session"]["meta"], "id": IMPORTED_ID}},
        }
    return params


async def invoke(run: Run, op: Operation, params: dict[str, Any], **client: Any) -> None:
    """Make the call (a stream is opened and closed again); its error is raised."""
    c = run.client(**client)
    if op.server_streaming:
        options = CallOptions(acp_version=c.acp_version, token=c.token, request_id=new_request_id())
        items = await c.transport.open_stream(op, request_for(op, params, {}), options)
        await items.aclose()  # type: ignore[attr-defined]
    else:
        await c.call(op.name, params)


async def outcome(run: Run, op: Operation, params: dict[str, Any], **client: Any) -> ACPError | None:
    """The error a call answers, or None, for a caller that checks it itself."""
    try:
        await invoke(run, op, params, **client)
    except ACPError as err:
        return err
    return None


def forbidden_code(params: dict[str, Any]) -> str:
    """What a token of another namespace gets: AUTH_FORBIDDEN for a namespace it names, and
    for a session or plan it reaches by id the answer an unknown id gets (issue 31, finding 9)."""
    reached_by_id = ("session_id", "plan_id", "approval_id")
    return "NOT_FOUND" if any(key in params for key in reached_by_id) else "AUTH_FORBIDDEN"


@scenario("auth.matrix")
async def auth_matrix(run: Run) -> None:
    """No token and an unknown token: AUTH_REQUIRED; a token of another namespace:
    AUTH_FORBIDDEN (NOT_FOUND for a session or plan it reaches by id), on every operation;
    an anonymous one answers all three. A token of the namespace and one of every namespace
    each run every operation where it can succeed (``own_subjects``), and the answer must
    be about that subject, in the state the operation leaves it (``check_answer``)."""
    world = await build_world(run)
    for principal in (None, "acp_not-a-token", "bob"):
        for op in catalog.OPERATIONS.values():
            params = world_request(op, world)
            if op.anonymous:
                data = await answer(run, op, params, principal)
                await check_answer(run, op, params, data, world)
            elif principal == "bob":
                await run.fails(invoke(run, op, params, principal=principal), forbidden_code(params))
            else:
                err = await run.fails(invoke(run, op, params, principal=principal), "AUTH_REQUIRED")
                assert err.details == {"scheme": "Bearer"}, err
    # A reader is refused every operation that changes something, whatever names its subject.
    for op in catalog.OPERATIONS.values():
        if not op.read_only and not op.anonymous:
            params = world_request(op, world)
            await run.fails(invoke(run, op, params, principal="reader"), "AUTH_FORBIDDEN", "ROLE_FORBIDDEN")
    for principal in ("alice", "root"):
        own = await own_subjects(run, world, principal)
        for op in catalog.OPERATIONS.values():
            params = {**world_request(op, world), **own.get(op.name, {})}
            data = await answer(run, op, params, principal)
            await check_answer(run, op, params, data, world)


def as_prior(op: Operation, data: dict[str, Any]) -> dict[str, Any]:
    """An answer of the current minor as a client of the prior one sees it."""
    return codec.to_dict(surface.strip(codec.response_from_dict(data, op.response_type), PRIOR))


@scenario("version.matrix")
async def version_matrix(run: Run) -> None:
    """Versions the server does not speak are VERSION_MISMATCH on every operation. A client
    of the prior minor is refused every operation introduced after it; every other one it
    is served as a client of the current minor is, each on a subject of its own in the
    state the operation needs (``own_subjects``): the answer is checked (``check_answer``),
    and a read answers both the same (without what is newer than the prior minor)."""
    world = await build_world(run)
    own = {version: await own_subjects(run, world, who) for version, who in VERSION_SUBJECTS.items()}
    for op in catalog.OPERATIONS.values():
        params = world_request(op, world)
        for version in UNSUPPORTED_VERSIONS:
            err = await run.fails(
                invoke(run, op, params, principal="alice", acp_version=version), "VERSION_MISMATCH"
            )
            assert err.details["supported_versions"] == list(versions.SUPPORTED)
        answers = {}
        for version in (PRIOR, versions.CURRENT):
            asked = {**params, **own[version].get(op.name, {})}
            if versions.newer(op.since, version):
                err = await run.fails(
                    invoke(run, op, asked, principal="alice", acp_version=version), "VERSION_MISMATCH"
                )
                assert err.details["since"] == op.since
                continue
            answers[version] = await answer(run, op, asked, "alice", acp_version=version)
            await check_answer(run, op, asked, answers[version], world)
        if op.read_only and len(answers) == 2:
            # Canonical: a time stamped by the read itself (an export's) differs, as does
            # a ticket, issued afresh; ``RecordingTransport`` checked their values.
            prior, expected = (
                Canonicalizer()(answers[PRIOR]),
                Canonicalizer()(as_prior(op, answers[versions.CURRENT])),
            )
            assert prior == expected, (op.name, prior, expected)


__all__ = ["SCENARIOS", "build_world", "world_request"]
