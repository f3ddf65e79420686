"""Expected revisions over a real server (ACP 1.3): REST ETag and If-Match (412 on a stale
one), the envelope's if_revision, gRPC's acp-if-revision metadata; same-revision updates
from two clients, one wins each round; plan.apply bound to a stale diff digest writes nothing."""

from __future__ import annotations

import asyncio

import grpc
import httpx
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract import catalog, revisions
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import plan_pb2, session_pb2
from tests.facade.plans import helpers
from tests.gateway.conftest import Served

ROUNDS = 5


def _clients(served: Served) -> list[tuple[str, ACPClient]]:
    token = served.token()
    server = served.server
    return [
        ("envelope", ACPClient(HTTPTransport.connect(server.http), token=token)),
        ("grpc", ACPClient(GrpcTransport.connect(server.grpc_target, timeout=30), token=token)),
    ]


def test_rest_etag_and_if_match(served: Served) -> None:
    headers = {"Authorization": f"Bearer {served.token()}"}
    with httpx.Client(base_url=served.server.http, headers=headers) as http:
        created = http.post("/api/v1/sessions", json={"title": "t"})
        assert created.status_code == 200
        session_id = created.json()["data"]["session"]["meta"]["id"]
        shown = http.get(f"/api/v1/sessions/{session_id}")
        assert shown.headers["ETag"] == '"1"'
        assert shown.json()["data"]["session"]["revision"] == 1
        changed = http.patch(
            f"/api/v1/sessions/{session_id}",
            json={"session": {"title": "new"}, "update_mask": "title"},
            headers={"If-Match": '"1"'},
        )
        assert changed.status_code == 200, changed.text
        assert changed.headers["ETag"] == '"2"'
        stale = http.patch(
            f"/api/v1/sessions/{session_id}",
            json={"session": {"title": "late"}, "update_mask": "title"},
            headers={"If-Match": '"1"'},
        )
        assert stale.status_code == 412
        error = stale.json()["error"]
        assert (error["code"], error["details"]["refinement"]) == ("INVALID_STATE", "REVISION_MISMATCH")
        assert (error["details"]["expected"], error["details"]["actual"]) == (1, 2)
        assert http.get(f"/api/v1/sessions/{session_id}").json()["data"]["session"]["title"] == "new"
        # Not one entity tag, or on a read: INVALID_PARAMS (422).
        for value in ("*", 'W/"2"', "2", '"1", "2"'):
            bad = http.delete(f"/api/v1/sessions/{session_id}", headers={"If-Match": value})
            assert (bad.status_code, bad.json()["error"]["code"]) == (422, "INVALID_PARAMS"), value
        read = http.get(f"/api/v1/sessions/{session_id}", headers={"If-Match": '"2"'})
        assert (read.status_code, read.json()["error"]["details"]["field"]) == (422, "if_revision")
        # The envelope's stale if_revision answers the category's status (409), not 412.
        envelope = http.post(
            "/api/v1/acp",
            json={"operation": "session.delete", "params": {"session_id": session_id}, "if_revision": 1},
        )
        assert (envelope.status_code, envelope.json()["error"]["details"]["refinement"]) == (
            409,
            "REVISION_MISMATCH",
        )
        # An ACP 1.2 client gets no revision and no ETag. (JSON still prints the stripped
        # 1.3 fields at their defaults, as it does 1.2's for 1.1 clients: codec.to_dict.)
        old = http.get(f"/api/v1/sessions/{session_id}", headers={"ACP-Version": "1.2"})
        assert old.json()["data"]["session"].get("revision", 0) == 0
        assert "ETag" not in old.headers
        assert http.delete(f"/api/v1/sessions/{session_id}", headers={"If-Match": '"2"'}).status_code == 200


def test_openapi_describes_if_match_and_etag_on_exactly_those_routes(served: Served) -> None:
    """The served document: If-Match and a 412 where the operation takes an expected
    revision, ETag where its answer carries a session or plan; nowhere else."""
    document = httpx.get(f"{served.server.http}/api/v1/openapi.json").json()
    by_id = {op.name: op for op in catalog.OPERATIONS.values()}
    seen: set[str] = set()
    for path_item in document["paths"].values():
        for spec in path_item.values():
            op = by_id.get(spec["operationId"])
            if op is None:
                # The envelope endpoint, /healthz, other majors' routes: no ETag, no If-Match.
                assert "412" not in spec["responses"], spec["operationId"]
                continue
            seen.add(op.name)
            if_match = [p for p in spec["parameters"] if p["name"] == "If-Match"]
            assert (len(if_match), "412" in spec["responses"]) == (
                (1, True) if op.if_revision else (0, False)
            ), op.name
            if if_match:
                assert if_match[0]["in"] == "header"
                assert "REVISION_MISMATCH" in spec["responses"]["412"]["description"]
            etag = "ETag" in spec["responses"]["200"].get("headers", {})
            assert etag == (revisions.carries_entity(op.response_type) and not op.server_streaming), op.name
    assert seen == set(by_id)
    takes = {name for name, op in by_id.items() if op.if_revision}
    assert {"session.update", "session.delete", "plan.apply"} <= takes
    carries = {name for name, op in by_id.items() if revisions.carries_entity(op.response_type)}
    assert {"session.show", "session.update", "plan.status"} <= carries


async def test_envelope_and_grpc_same_revision_one_wins(served: Served) -> None:
    clients = _clients(served)
    try:
        (_, envelope), (_, via_grpc) = clients
        created = await envelope.call("session.create", title="race")
        assert isinstance(created, session_pb2.CreateSessionResponse)
        session_id, revision = created.session.meta.id, created.session.revision
        for round_ in range(ROUNDS):
            outcomes = await asyncio.gather(
                *(
                    client.call(
                        "session.update",
                        session_id=session_id,
                        session={"title": f"{name} {round_}"},
                        update_mask="title",
                        if_revision=revision,
                    )
                    for name, client in clients
                ),
                return_exceptions=True,
            )
            won = [o for o in outcomes if isinstance(o, session_pb2.UpdateSessionResponse)]
            lost = [o for o in outcomes if isinstance(o, ACPError)]
            assert (len(won), len(lost)) == (1, 1), outcomes
            assert (lost[0].code, lost[0].details["refinement"]) == ("INVALID_STATE", "REVISION_MISMATCH")
            revision += 1
        # gRPC: FAILED_PRECONDITION with the ACP code as the ErrorInfo reason.
        with pytest.raises(ACPError) as stale:
            await via_grpc.call("session.resume", session_id=session_id, if_revision=1)
        assert stale.value.details["refinement"] == "REVISION_MISMATCH"
        async with grpc.aio.insecure_channel(served.server.grpc_target) as channel:
            method = channel.unary_unary(
                "/cleveragents.acp.v1.SessionService/DeleteSession",
                request_serializer=session_pb2.DeleteSessionRequest.SerializeToString,
                response_deserializer=session_pb2.DeleteSessionResponse.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as raw:
                await method(
                    session_pb2.DeleteSessionRequest(session_id=session_id),
                    metadata=(("authorization", f"Bearer {served.token()}"), ("acp-if-revision", "1")),
                )
            assert raw.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            with pytest.raises(grpc.aio.AioRpcError) as garbled:
                await method(
                    session_pb2.DeleteSessionRequest(session_id=session_id),
                    metadata=(("authorization", f"Bearer {served.token()}"), ("acp-if-revision", "one")),
                )
            assert garbled.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        for _, client in clients:
            await client.close()


async def test_apply_with_a_stale_diff_digest_writes_nothing(served: Served) -> None:
    folder = served.directory.parent / "digest-project"
    helpers.write_tree(folder)
    clients = _clients(served)
    try:
        for name, client in clients:
            await helpers.add_project(client, folder, name=f"p-{name}", resource=f"r-{name}")
            await helpers.add_action(client, name=f"a-{name}")
            used = await client.call(
                "plan.use", action=f"a-{name}", project=f"p-{name}", inputs=helpers.INPUTS
            )
            assert isinstance(used, plan_pb2.UsePlanResponse)
            plan_id = used.plan.meta.id
            await client.call("plan.execute", plan_id=plan_id, wait=True)
            diff = await client.call("plan.diff", plan_id=plan_id)
            assert isinstance(diff, plan_pb2.GetPlanDiffResponse)
            assert diff.digest.startswith("sha256:")
            assert len(diff.digest) == 71
            again = await client.call("plan.diff", plan_id=plan_id)
            assert isinstance(again, plan_pb2.GetPlanDiffResponse)
            assert again.digest == diff.digest
            before = helpers.snapshot(folder)
            stale = "sha256:" + "0" * 64
            with pytest.raises(ACPError) as refused:
                await client.call("plan.apply", plan_id=plan_id, diff_digest=stale)
            assert (refused.value.code, refused.value.details["refinement"]) == (
                "INVALID_STATE",
                "DIFF_CHANGED",
            )
            assert refused.value.details["actual"] == diff.digest
            with pytest.raises(ACPError) as garbled:
                await client.call("plan.apply", plan_id=plan_id, diff_digest="md5:abc")
            assert garbled.value.code == "INVALID_PARAMS"
            assert helpers.snapshot(folder) == before
            status = await helpers.status(client, plan_id)
            # The reviewed digest applies.
            applied = await client.call(
                "plan.apply", plan_id=plan_id, diff_digest=diff.digest, if_revision=status.revision
            )
            assert isinstance(applied, plan_pb2.ApplyPlanResponse)
            assert applied.plan.revision > status.revision
            assert helpers.snapshot(folder) != before
            helpers.write_tree(folder)
            for stray in ("docs/guide.md",):
                (folder / stray).unlink(missing_ok=True)
    finally:
        for _, client in clients:
            await client.close()
