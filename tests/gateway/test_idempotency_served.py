"""Request ids on a real ``agents serve``: a server SIGKILLed after a call's effect
committed and before its answer went out answers the retry after a restart from the
store, with exactly one effect and one set of events; every wire (envelope, REST with
X-Request-ID or Idempotency-Key, gRPC x-request-id) replays and marks the replay."""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3
import threading
import time
from typing import Any

import grpc
import httpx
import pytest

from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.call import Reply
from cleveragents.acp.contract.errors import ACPError, http_status
from cleveragents.acp.contract.transport import CallOptions, Transport
from cleveragents.acp.facade.idempotency import KILL_AFTER_COMMIT_ENV
from cleveragents.acp.v1 import session_pb2
from tests.gateway.test_http import data_of, envelope, error_of
from tests.server_process import ServerProcess, Tokens, kill_group, run_agents, start_gateway, start_server


def events_of(db: pathlib.Path, plan_id: str) -> list[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [
            row[0]
            for row in conn.execute("SELECT type FROM events WHERE plan_id=? ORDER BY sequence", (plan_id,))
        ]
    finally:
        conn.close()


def plans_in(db: pathlib.Path) -> list[str]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return [row[0] for row in conn.execute("SELECT id FROM records WHERE kind='plan'")]
    finally:
        conn.close()


def setup_action(client: httpx.Client, token: str, folder: pathlib.Path) -> None:
    folder.mkdir()
    steps = [{"tool": "fs.write", "args": {"path": "a.txt", "content": "a"}}]
    for operation, params in (
        ("resource.add", {"name": "site", "spec": {"type": "directory", "path": str(folder)}}),
        ("project.add", {"name": "demo", "spec": {"resources": ["site"]}}),
        ("action.add", {"name": "one", "spec": {"actor": "scripted", "steps": steps}}),
    ):
        data_of(envelope(client, {"operation": operation, "params": params}, token))


USE = {"operation": "plan.use", "params": {"action": "one", "project": "demo"}, "request_id": "use-1"}


def test_killed_after_the_commit_the_restarted_server_answers_the_retry_once(tmp_path: pathlib.Path) -> None:
    tokens = Tokens.create(tmp_path)
    token = tokens.tokens["alice"]
    db = tmp_path / "server.db"
    server: ServerProcess | None = start_server(
        tmp_path, tokens=tokens.path, env={KILL_AFTER_COMMIT_ENV: "plan.use"}
    )
    try:
        assert server is not None
        with httpx.Client(base_url=server.http, timeout=30) as client:
            setup_action(client, token, tmp_path / "site")
            with pytest.raises(httpx.HTTPError):
                envelope(client, USE, token)
        assert server.process.wait(15) == -9
        server.stop()
        # The effect committed: one plan, its plan.created event, before any answer.
        [plan_id] = plans_in(db)
        assert events_of(db, plan_id) == ["plan.created"]
        server = start_server(tmp_path, tokens=tokens.path)
        with httpx.Client(base_url=server.http, timeout=30) as client:
            retried = envelope(client, USE, token)
            assert retried.headers["acp-replayed"] == "true"
            plan = data_of(retried)["plan"]
            assert plan["meta"]["id"] == plan_id
            again = envelope(client, USE, token)
            assert again.headers["acp-replayed"] == "true"
            assert data_of(again) == data_of(retried)
            listed = data_of(envelope(client, {"operation": "plan.list", "params": {}}, token))
            assert [p["meta"]["id"] for p in listed["plans"]] == [plan_id]
            assert (
                "acp-replayed"
                not in envelope(client, {"operation": "plan.list", "params": {}}, token).headers
            )
        assert plans_in(db) == [plan_id]
        assert events_of(db, plan_id) == ["plan.created"]
    finally:
        if server is not None:
            if server.process.poll() is None:
                assert server.stop() == 0, server.stderr()
            else:
                kill_group(server.process)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    directory = tmp_path_factory.mktemp("idempotency")
    tokens = Tokens.create(directory)
    server = start_server(directory, tokens=tokens.path)
    try:
        yield server, tokens
    finally:
        assert server.stop() == 0, server.stderr()


def sessions(client: httpx.Client, token: str) -> list[str]:
    listed = data_of(envelope(client, {"operation": "session.list", "params": {"page_size": 100}}, token))
    return [s["meta"]["id"] for s in listed.get("sessions", [])]


def test_envelope_and_rest_replay_with_the_marker_over_every_header(served: Any) -> None:
    server, tokens = served
    token = tokens.tokens["alice"]
    auth = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=server.http, timeout=30) as client:
        before = set(sessions(client, token))
        body = {"operation": "session.create", "params": {"title": "env"}, "request_id": "env-1"}
        first = envelope(client, body, token)
        assert "acp-replayed" not in first.headers
        second = envelope(client, body, token)
        assert second.headers["acp-replayed"] == "true"
        assert data_of(second) == data_of(first)
        # The same id over REST is the same call: replayed, whichever header carries it.
        for header in ("X-Request-ID", "Idempotency-Key"):
            rest = client.post("/api/v1/sessions", json={"title": "rest"}, headers={**auth, header: "rest-1"})
            assert data_of(rest)["session"]["title"] == "rest"
        replays = [
            client.post("/api/v1/sessions", json={"title": "rest"}, headers={**auth, header: "rest-1"})
            for header in ("X-Request-ID", "Idempotency-Key")
        ]
        assert all(r.headers["acp-replayed"] == "true" for r in replays)
        both = client.post(
            "/api/v1/sessions",
            json={"title": "rest"},
            headers={**auth, "X-Request-ID": "rest-1", "Idempotency-Key": "rest-1"},
        )
        assert both.headers["acp-replayed"] == "true"
        conflict = client.post(
            "/api/v1/sessions",
            json={"title": "rest"},
            headers={**auth, "X-Request-ID": "a-1", "Idempotency-Key": "b-1"},
        )
        assert conflict.status_code == http_status("INVALID_PARAMS")
        assert conflict.json()["error"]["details"]["refinement"] == "REQUEST_ID_CONFLICT"
        reused = client.post(
            "/api/v1/sessions", json={"title": "other"}, headers={**auth, "Idempotency-Key": "rest-1"}
        )
        assert reused.status_code == http_status("INVALID_PARAMS")
        assert reused.json()["error"]["details"]["refinement"] == "REQUEST_ID_REUSED"
        assert reused.headers.get("acp-replayed") is None
        # Errors are replayed too, and marked.
        missing = {"operation": "session.delete", "params": {"session_id": "nope"}, "request_id": "gone-1"}
        refused = [envelope(client, missing, token) for _ in range(2)]
        assert [r.status_code for r in refused] == [404, 404]
        assert refused[1].headers["acp-replayed"] == "true"
        assert refused[0].json()["error"] == refused[1].json()["error"]
        # Without a request id of the caller's, each call is new.
        plain = {"operation": "session.create", "params": {"title": "plain"}}
        assert data_of(envelope(client, plain, token)) != data_of(envelope(client, plain, token))
        made = set(sessions(client, token)) - before
        assert len(made) == 1 + 1 + 2


def test_the_principal_is_part_of_the_key(served: Any) -> None:
    server, tokens = served
    with httpx.Client(base_url=server.http, timeout=30) as client:
        body = {"operation": "session.create", "params": {"title": "mine"}, "request_id": "shared-1"}
        alice = envelope(client, body, tokens.tokens["alice"])
        root = envelope(client, body, tokens.tokens["root"])
        assert "acp-replayed" not in root.headers
        assert data_of(alice)["session"]["meta"]["id"] != data_of(root)["session"]["meta"]["id"]


def test_concurrent_duplicates_over_http_make_one_session(served: Any) -> None:
    server, tokens = served
    token = tokens.tokens["alice"]
    body = {"operation": "session.create", "params": {"title": "race"}, "request_id": "race-1"}
    answers: list[httpx.Response] = []
    lock = threading.Lock()

    def send() -> None:
        with httpx.Client(base_url=server.http, timeout=30) as client:
            response = envelope(client, body, token)
        with lock:
            answers.append(response)

    threads = [threading.Thread(target=send) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(answers) == 6
    ids = {data_of(r)["session"]["meta"]["id"] for r in answers}
    assert len(ids) == 1
    assert sum(r.headers.get("acp-replayed") == "true" for r in answers) == 5


def test_grpc_replays_with_a_trailer(served: Any) -> None:
    server, tokens = served
    op = catalog.OPERATIONS["session.create"]

    async def main() -> None:
        async with grpc.aio.insecure_channel(server.grpc_target) as channel:
            method = channel.unary_unary(
                op.full_method,
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=op.response_type.FromString,
            )
            metadata = (("authorization", f"Bearer {tokens.tokens['alice']}"), ("x-request-id", "grpc-1"))
            request = session_pb2.CreateSessionRequest(title="grpc")
            answers = []
            for _ in range(2):
                call = method(request, metadata=metadata, timeout=30)
                answers.append((await call, dict(await call.trailing_metadata() or ())))
            (first, first_trailers), (second, second_trailers) = answers
            assert "acp-replayed" not in first_trailers
            assert second_trailers["acp-replayed"] == "true"
            assert second == first
            other = method(session_pb2.CreateSessionRequest(title="else"), metadata=metadata, timeout=30)
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await other
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    asyncio.run(main())


def test_a_restart_keeps_the_answers(tmp_path: pathlib.Path) -> None:
    tokens = Tokens.create(tmp_path)
    token = tokens.tokens["alice"]
    body = {"operation": "session.create", "params": {"title": "kept"}, "request_id": "kept-1"}
    server = start_server(tmp_path, tokens=tokens.path)
    try:
        with httpx.Client(base_url=server.http, timeout=30) as client:
            first = data_of(envelope(client, body, token))
    finally:
        assert server.stop() == 0, server.stderr()
    server = start_server(tmp_path, tokens=tokens.path)
    try:
        with httpx.Client(base_url=server.http, timeout=30) as client:
            again = envelope(client, body, token)
            assert again.headers["acp-replayed"] == "true"
            assert data_of(again) == first
            assert sessions(client, token) == [first["session"]["meta"]["id"]]
    finally:
        assert server.stop() == 0, server.stderr()


def test_killed_after_a_tell_the_retry_says_the_answer_was_lost_and_nothing_runs_twice(
    tmp_path: pathlib.Path,
) -> None:
    """session.tell's answer (its messages) is not rebuildable from records: after a kill
    between its effect and its answer the retry is INVALID_STATE REQUEST_ANSWER_LOST, and the
    user's message is stored once."""
    tokens = Tokens.create(tmp_path)
    token = tokens.tokens["alice"]
    server: ServerProcess | None = start_server(
        tmp_path, tokens=tokens.path, env={KILL_AFTER_COMMIT_ENV: "session.tell"}
    )
    tell: dict[str, Any] = {"operation": "session.tell", "request_id": "tell-1"}
    try:
        assert server is not None
        with httpx.Client(base_url=server.http, timeout=30) as client:
            made = data_of(envelope(client, {"operation": "session.create", "params": {}}, token))
            session_id = made["session"]["meta"]["id"]
            tell["params"] = {"session_id": session_id, "content": "hello"}
            with pytest.raises(httpx.HTTPError):
                envelope(client, tell, token)
        assert server.process.wait(15) == -9
        server.stop()
        server = start_server(tmp_path, tokens=tokens.path)
        with httpx.Client(base_url=server.http, timeout=30) as client:
            for _ in range(2):
                lost = envelope(client, tell, token)
                assert error_of(lost, "INVALID_STATE")["refinement"] == "REQUEST_ANSWER_LOST"
                assert lost.headers["acp-replayed"] == "true"
            show = {"operation": "session.show", "params": {"session_id": session_id}}
            messages = data_of(envelope(client, show, token))["messages"]
            assert [m["content"] for m in messages].count("hello") == 1
    finally:
        if server is not None:
            if server.process.poll() is None:
                assert server.stop() == 0, server.stderr()
            else:
                kill_group(server.process)


def test_the_client_transports_read_the_marker_into_call_options(served: Any) -> None:
    """``CallOptions(reply=Reply())``: HTTPTransport and GrpcTransport fill ``reply.replayed``
    from the header and the trailer, on an answer and on an error."""
    server, tokens = served
    token = tokens.tokens["alice"]
    op = catalog.OPERATIONS["session.create"]
    delete = catalog.OPERATIONS["session.delete"]

    async def main() -> None:
        transports: list[tuple[str, Transport]] = [
            ("http", HTTPTransport.connect(server.http)),
            ("grpc", GrpcTransport.connect(server.grpc_target, timeout=30)),
        ]
        try:
            for name, transport in transports:
                replies = []
                answers = []
                for _ in range(2):
                    reply = Reply()
                    options = CallOptions(acp_version=None, token=token, request_id=f"{name}-t", reply=reply)
                    create = session_pb2.CreateSessionRequest(title=name)
                    answers.append(await transport.call(op, create, options))
                    replies.append(reply.replayed)
                assert replies == [False, True], name
                assert answers[0] == answers[1]
                refused = []
                gone = session_pb2.DeleteSessionRequest(session_id="nope")
                for _ in range(2):
                    reply = Reply()
                    options = CallOptions(acp_version=None, token=token, request_id=f"{name}-d", reply=reply)
                    with pytest.raises(ACPError) as missing:
                        await transport.call(delete, gone, options)
                    assert missing.value.code == "NOT_FOUND"
                    refused.append(reply.replayed)
                assert refused == [False, True], name
        finally:
            for _, transport in transports:
                await transport.close()

    asyncio.run(main())


def test_gateway_only_mode_passes_the_id_up_and_the_marker_back(served: Any, tmp_path: pathlib.Path) -> None:
    server, tokens = served
    token = tokens.tokens["alice"]
    gateway = start_gateway(tmp_path, server.grpc_target)
    try:
        body = {"operation": "session.create", "params": {"title": "via gw"}, "request_id": "gw-1"}
        with httpx.Client(base_url=gateway.http, timeout=30) as client:
            first = envelope(client, body, token)
            second = envelope(client, body, token)
        assert "acp-replayed" not in first.headers
        assert second.headers["acp-replayed"] == "true"
        assert data_of(second) == data_of(first)
        with httpx.Client(base_url=server.http, timeout=30) as direct:
            again = envelope(direct, body, token)
        assert again.headers["acp-replayed"] == "true"
        assert data_of(again) == data_of(first)
    finally:
        assert gateway.stop() == 0, gateway.stderr()


def test_request_retention_is_a_serve_setting(tmp_path: pathlib.Path) -> None:
    """Past ``--request-retention`` the id is new again: the call runs a second time."""
    tokens = Tokens.create(tmp_path)
    token = tokens.tokens["alice"]
    server = start_server(tmp_path, "--request-retention", "0.5", tokens=tokens.path)
    try:
        body = {"operation": "session.create", "params": {"title": "short"}, "request_id": "short-1"}
        with httpx.Client(base_url=server.http, timeout=30) as client:
            first = data_of(envelope(client, body, token))
            assert envelope(client, body, token).headers["acp-replayed"] == "true"
            time.sleep(0.7)
            later = envelope(client, body, token)
            assert "acp-replayed" not in later.headers
            assert data_of(later)["session"]["meta"]["id"] != first["session"]["meta"]["id"]
    finally:
        assert server.stop() == 0, server.stderr()
    args = ["serve", "--request-retention", "0", "--tokens", str(tokens.path)]
    refused = run_agents(args, tmp_path, name="bad")
    try:
        assert refused.wait(60) != 0
    finally:
        kill_group(refused)
        if refused.stdout is not None:
            refused.stdout.close()
    assert "request_retention" in (tmp_path / "bad.stderr").read_text()
