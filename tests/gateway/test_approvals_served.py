"""Approvals over a real server (ACP 1.3): a model plan (the fake OpenAI server) whose fs.write
needs an answer pauses, and is answered over REST by a client generated from the served
OpenAPI document by openapi-python-client (nobody here wrote it), over gRPC and over the
envelope; each resumes and finishes. A server killed (SIGKILL) while a plan waits: after the
restart the request is still pending and one answer resumes the plan once. Eight concurrent
answers to ``agents serve --workers 2`` over two wires: one decision, seven refused, one run."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import pathlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import approval_pb2, plan_pb2
from tests.facade.plans.helpers import add_project, write_tree
from tests.facade.plans.model_world import KEY, KEY_ENV, model_world
from tests.fake_openai import FakeOpenAI, turn
from tests.server_process import Children, ServerProcess, Tokens, start_server

ALLOW_ONCE = approval_pb2.APPROVAL_ANSWER_ALLOW_ONCE
GENERATOR = pathlib.Path(sys.executable).with_name("openapi-python-client")


@pytest.fixture
def children() -> Iterator[Children]:
    made = Children()
    yield made
    made.kill_all()


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start_in_thread()
    yield server
    server.stop_thread()


def envelope(server: ServerProcess, token: str) -> ACPClient:
    return ACPClient(HTTPTransport.connect(server.http), token=token)


def grpc_client(server: ServerProcess, token: str) -> ACPClient:
    return ACPClient(GrpcTransport.connect(server.grpc_target, timeout=30), token=token)


async def settled(client: ACPClient, plan_id: str, state: int) -> plan_pb2.Plan:
    async with asyncio.timeout(30):
        while True:
            plan = (await client.call("plan.status", plan_id=plan_id)).plan  # type: ignore[attr-defined]
            if plan.state == state:
                assert isinstance(plan, plan_pb2.Plan)
                return plan
            await asyncio.sleep(0.05)


async def waiting(client: ACPClient, **use: Any) -> tuple[str, approval_pb2.Approval]:
    used = await client.call("plan.use", {"action": "act", "project": "proj", **use})
    plan_id = used.plan.meta.id  # type: ignore[attr-defined]
    executed = await client.call("plan.execute", plan_id=plan_id, wait=True)
    assert executed.plan.state == plan_pb2.PLAN_STATE_AWAITING_APPROVAL, executed  # type: ignore[attr-defined]
    listed = await client.call("approval.list", plan_id=plan_id)
    [approval] = listed.approvals  # type: ignore[attr-defined]
    assert isinstance(approval, approval_pb2.Approval)
    return plan_id, approval


def generated_client(server: ServerProcess, folder: pathlib.Path) -> Any:
    """openapi-python-client's package for the document this server serves (generated here,
    offline), imported."""
    document = httpx.get(server.http + "/api/v1/openapi.json", timeout=30)
    assert document.status_code == 200
    (folder / "openapi.json").write_text(document.text)
    package = folder / "acp_generated"
    document_path = str(folder / "openapi.json")
    args = ["generate", "--path", document_path, "--meta", "none", "--output-path", str(package)]
    done = subprocess.run(
        [str(GENERATOR), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PATH": f"{GENERATOR.parent}:{os.environ.get('PATH', '')}"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    sys.path.insert(0, str(folder))
    try:
        return importlib.import_module("acp_generated")
    finally:
        sys.path.remove(str(folder))


async def test_a_model_plans_write_is_answered_over_a_generated_rest_client_grpc_and_the_envelope(
    tmp_path: pathlib.Path, children: Children, fake: FakeOpenAI
) -> None:
    tokens = Tokens.create(tmp_path)
    flags = ["--model-endpoint", fake.base_url, "--model-key-env", KEY_ENV]
    server = children.server(
        start_server(tmp_path, *flags, tokens=tokens.path, env={**os.environ, KEY_ENV: KEY})
    )
    token = tokens.tokens["alice"]
    alice = envelope(server, token)
    await model_world(alice, tmp_path / "project", fake.base_url, profile={"approval": {"ask": ["fs.write"]}})
    rest = generated_client(server, tmp_path)
    answer_api = importlib.import_module("acp_generated.api.approval.approval_answer")
    models = importlib.import_module("acp_generated.models")
    authed = rest.AuthenticatedClient(base_url=server.http, token=token, timeout=httpx.Timeout(30))

    async def rest_answer(approval: approval_pb2.Approval) -> None:
        body = models.CleveragentsAcpV1AnswerApprovalRequest(
            approval_id=approval.id,
            answer=models.CleveragentsAcpV1AnswerApprovalRequestAnswer("APPROVAL_ANSWER_ALLOW_ONCE"),
            reason="over REST",
        )
        response = await answer_api.asyncio_detailed(approval.id, client=authed, body=body)
        assert response.status_code == 200, response.content
        data = json.loads(response.content)["data"]["approval"]
        assert (data["state"], data["answered_by"]) == ("APPROVAL_STATE_ALLOWED", "alice"), data

    async def grpc_answer(approval: approval_pb2.Approval) -> None:
        async with grpc_client(server, token) as client:
            decided = await client.call("approval.answer", approval_id=approval.id, answer=ALLOW_ONCE)
        assert decided.approval.state == approval_pb2.APPROVAL_STATE_ALLOWED  # type: ignore[attr-defined]

    async def envelope_answer(approval: approval_pb2.Approval) -> None:
        decided = await alice.call("approval.answer", approval_id=approval.id, answer=ALLOW_ONCE)
        assert decided.approval.state == approval_pb2.APPROVAL_STATE_ALLOWED  # type: ignore[attr-defined]

    for how, answer in (("rest", rest_answer), ("grpc", grpc_answer), ("envelope", envelope_answer)):
        fake.then(
            turn("", [("fs_write", {"path": f"{how}.md", "content": f"{how}\n"})]),
            turn(f"Wrote {how}.md.", tokens=(10, 2)),
        )
        plan_id, approval = await waiting(alice, inputs={"word": how})
        assert (approval.tool, approval.args["path"]) == ("fs.write", f"{how}.md")
        await answer(approval)
        done = await settled(alice, plan_id, plan_pb2.PLAN_STATE_SUCCEEDED)
        assert done.progress.done == 1, (how, done)
        diff = await alice.call("plan.diff", plan_id=plan_id)
        assert [f.path for f in diff.files] == [f"{how}.md"]  # type: ignore[attr-defined]
    await alice.close()
    await authed.get_async_httpx_client().aclose()


def gated_scripted(folder: pathlib.Path) -> dict[str, Any]:
    write_tree(folder)
    return {
        "actor": "scripted",
        "steps": [{"id": "create", "tool": "fs.write", "args": {"path": "NOTES.md", "content": "hi\n"}}],
        "automation_profile": "gated",
    }


async def scripted_world(client: ACPClient, folder: pathlib.Path) -> None:
    spec = gated_scripted(folder)
    await add_project(client, folder)
    await client.call("automation_profile.add", name="gated", spec={"approval": {"ask": ["fs.write"]}})
    await client.call("action.add", name="act", spec=spec)


async def invoked(client: ACPClient, plan_id: str) -> list[str]:
    """The steps whose tool.invoked the log holds for the plan (read until it goes quiet)."""
    found: list[str] = []
    stream = aiter(client.subscribe(plan_id=plan_id))
    try:
        while True:
            try:
                event = await asyncio.wait_for(anext(stream), 1.0)
            except TimeoutError:
                return found
            if event.type == "tool.invoked":
                found.append(event.tool_invoked.step_id)
    finally:
        await stream.aclose()  # type: ignore[attr-defined]


async def test_a_plan_waiting_through_a_kill_9_is_still_pending_and_one_answer_resumes_it_once(
    tmp_path: pathlib.Path, children: Children
) -> None:
    tokens = Tokens.create(tmp_path)
    server = children.server(start_server(tmp_path, tokens=tokens.path))
    token = tokens.tokens["alice"]
    alice = envelope(server, token)
    await scripted_world(alice, tmp_path / "project")
    plan_id, approval = await waiting(alice)
    await alice.close()
    server.process.send_signal(signal.SIGKILL)
    server.process.wait(timeout=30)
    restarted = children.server(start_server(tmp_path, tokens=tokens.path))
    again = envelope(restarted, token)
    shown = (await again.call("approval.show", approval_id=approval.id)).approval  # type: ignore[attr-defined]
    assert shown.state == approval_pb2.APPROVAL_STATE_PENDING
    status = (await again.call("plan.status", plan_id=plan_id)).plan  # type: ignore[attr-defined]
    assert status.state == plan_pb2.PLAN_STATE_AWAITING_APPROVAL
    await again.call("approval.answer", approval_id=approval.id, answer=ALLOW_ONCE)
    await settled(again, plan_id, plan_pb2.PLAN_STATE_SUCCEEDED)
    assert await invoked(again, plan_id) == ["create"]
    await again.close()


async def test_eight_concurrent_answers_to_two_workers_store_one_decision_and_resume_once(
    tmp_path: pathlib.Path, children: Children
) -> None:
    tokens = Tokens.create(tmp_path)
    server = children.server(start_server(tmp_path, "--workers", "2", tokens=tokens.path))
    token = tokens.tokens["alice"]
    seeder = envelope(server, token)
    await scripted_world(seeder, tmp_path / "project")
    plan_id, approval = await waiting(seeder)
    # Fresh connections, half gRPC and half HTTP: the kernel spreads them over the workers.
    clients = [grpc_client(server, token) if i % 2 else envelope(server, token) for i in range(8)]

    async def answer(client: ACPClient) -> str:
        try:
            await client.call("approval.answer", approval_id=approval.id, answer=ALLOW_ONCE)
        except ACPError as exc:
            return f"{exc.code} {exc.details.get('refinement')}"
        return "decided"

    outcomes = await asyncio.gather(*(answer(c) for c in clients))
    assert sorted(outcomes) == ["INVALID_STATE APPROVAL_DECIDED"] * 7 + ["decided"], outcomes
    await settled(seeder, plan_id, plan_pb2.PLAN_STATE_SUCCEEDED)
    assert await invoked(seeder, plan_id) == ["create"]
    listed = await seeder.call("approval.list", plan_id=plan_id)
    assert [a.state for a in listed.approvals] == [approval_pb2.APPROVAL_STATE_ALLOWED]  # type: ignore[attr-defined]
    for client in (*clients, seeder):
        await client.close()
