"""ACP 2 served beside ACP 1 by the real ``agents serve`` (a subprocess whose product catalog
discovers both majors), over the envelope, REST, gRPC and the CLI (local, HTTP, gRPC)."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import httpx
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract import errors, rich_status
from cleveragents.acp.contract.catalog import Catalog
from cleveragents.acp.contract.errors import ACPError
from tests.server_process import ServerProcess, Tokens, wait_ready

TIMEOUT = 60.0
ROOT = pathlib.Path(__file__).resolve().parents[2]


def agents_v2(package: pathlib.Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "tests.proto_v2.agents", str(package), *args]


def environment(directory: pathlib.Path) -> dict[str, str]:
    """No ACP_* setting of the caller's; ``tests`` importable from any working directory."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACP_")}
    env["XDG_CONFIG_HOME"] = str(directory / "config")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


@dataclass
class Served:
    server: ServerProcess
    tokens: Tokens
    package: pathlib.Path
    directory: pathlib.Path
    session_id: str

    @property
    def alice(self) -> str:
        return self.tokens.tokens["alice"]

    def cli(self, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            agents_v2(self.package, *args),
            env=environment(self.directory),
            cwd=self.directory,
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert done.returncode == expect, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr
        return done


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, v2_package: pathlib.Path) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("served-v2")
    tokens = Tokens.create(directory)
    args = ["serve", "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--db"]
    args += [str(directory / "server.db"), "--tokens", str(tokens.path), "--grace-seconds", "3"]
    stderr = open(directory / "server.stderr", "w")  # noqa: SIM115 - handed to the child
    try:
        process = subprocess.Popen(
            agents_v2(v2_package, *args),
            stdout=subprocess.PIPE,
            stderr=stderr,
            cwd=directory,
            env=environment(directory),
            # A group of its own, so a failed start kills it with what it started (kill_group).
            start_new_session=True,
        )
    finally:
        stderr.close()
    server = wait_ready(process, directory / "server.stderr")
    try:
        made = Served(server, tokens, v2_package, directory, "")
        created = made.cli(
            "--server", server.http, "--token", made.alice, "session", "create", "--value", "session.meta.id"
        )
        made.session_id = created.stdout.strip()
        made.cli("--server", server.http, "--token", made.alice, "session", "tell", made.session_id, "/help")
        yield made
    finally:
        assert server.stop() == 0, server.stderr()


@pytest.fixture
async def http(served: Served) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {served.alice}"}
    async with httpx.AsyncClient(base_url=served.server.http, headers=headers, timeout=TIMEOUT) as client:
        yield client


def _v2_shape(data: dict[str, object], session_id: str) -> None:
    assert set(data) == {"session", "latest_message", "message_count"}, data
    assert data["message_count"] == 2
    assert data["session"]["meta"]["id"] == session_id  # type: ignore[index]


def _v1_shape(data: dict[str, Any]) -> None:
    """session.show at ACP 1.3 (every caller here speaks it)."""
    # next_page_token: ACP 1.2's paging of the history ("" when not paging); turns: ACP 1.3's
    # turns of the page's user messages.
    assert set(data) == {"session", "messages", "next_page_token", "turns"}, data
    assert len(data["messages"]) == 2
    assert [(t["state"], t["message_id"]) for t in data["turns"]] == [
        ("TURN_STATE_SUCCEEDED", data["messages"][0]["id"])
    ]


async def test_envelope_each_major_at_its_own_endpoint(served: Served, http: httpx.AsyncClient) -> None:
    params = {"session_id": served.session_id}
    v2 = (await http.post("/api/v2/acp", json={"operation": "session.show", "params": params})).json()
    assert (v2["status"], v2["acp_version"]) == ("ok", "2.0"), v2
    _v2_shape(v2["data"], served.session_id)
    v1 = (await http.post("/api/v1/acp", json={"operation": "session.show", "params": params})).json()
    assert (v1["status"], v1["acp_version"]) == ("ok", "1.3"), v1
    _v1_shape(v1["data"])


@pytest.mark.parametrize(
    ("body", "code", "detail"),
    [
        ({"operation": "session.create", "params": {}}, "NOT_FOUND", {"operation": "session.create"}),
        ({"operation": "session.show", "params": {}}, "INVALID_PARAMS", {"missing_fields": ["session_id"]}),
        ({"operation": "session.show", "params": {"session_id": "nope"}}, "NOT_FOUND", {}),
        ({"operation": "session.show", "params": {"session_id": 7}}, "INVALID_PARAMS", {}),
        (
            {"operation": "session.show", "params": {"session_id": "x"}, "acp_version": "1.2"},
            "VERSION_MISMATCH",
            {"supported_versions": ["2.0"]},
        ),
    ],
)
async def test_envelope_bad_calls_of_the_second_major(
    http: httpx.AsyncClient, body: dict[str, object], code: str, detail: dict[str, object]
) -> None:
    answer = await http.post("/api/v2/acp", json=body)
    envelope = answer.json()
    assert envelope["status"] == "error", envelope
    assert envelope["error"]["code"] == code, envelope
    assert envelope["error"]["details"].items() >= detail.items(), envelope
    assert answer.status_code == errors.http_status(code)
    assert envelope["acp_version"] == "2.0"


async def test_rest_routes_of_each_major(served: Served, http: httpx.AsyncClient) -> None:
    v2 = await http.get(f"/api/v2/sessions/{served.session_id}")
    assert (v2.status_code, v2.headers["ACP-Version"]) == (200, "2.0"), v2.text
    _v2_shape(v2.json()["data"], served.session_id)
    v1 = await http.get(f"/api/v1/sessions/{served.session_id}")
    assert v1.headers["ACP-Version"] == "1.3"
    _v1_shape(v1.json()["data"])
    # ACP 2 has no session list; a 1.x version on an ACP 2 route is refused.
    missing = await http.get("/api/v2/sessions")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "NOT_FOUND")
    older = await http.get(f"/api/v2/sessions/{served.session_id}", headers={"ACP-Version": "1.2"})
    assert older.json()["error"]["code"] == "VERSION_MISMATCH"
    assert older.json()["error"]["details"]["supported_versions"] == ["2.0"]
    anonymous = await http.get(f"/api/v2/sessions/{served.session_id}", headers={"Authorization": ""})
    assert anonymous.json()["error"]["code"] == "AUTH_REQUIRED"


@pytest.mark.parametrize("kind", ["http", "grpc"])
async def test_clients_speaking_2_0_over_each_transport(
    served: Served, v1_and_v2: Catalog, kind: str
) -> None:
    if kind == "http":
        transport: HTTPTransport | GrpcTransport = HTTPTransport.connect(served.server.http)
    else:
        transport = GrpcTransport.connect(served.server.grpc_target)
    v2 = ACPClient(transport, acp_version="2.0", token=served.alice, contract=v1_and_v2)
    v1 = ACPClient(transport, token=served.alice, contract=v1_and_v2)
    try:
        shown = await v2.call("session.show", session_id=served.session_id)
        assert shown.DESCRIPTOR.full_name == "cleveragents.acp.v2.GetSessionResponse"
        assert shown.message_count == 2  # type: ignore[attr-defined]
        assert shown.latest_message.content  # type: ignore[attr-defined]
        assert len((await v1.call("session.show", session_id=served.session_id)).messages) == 2  # type: ignore[attr-defined]
        with pytest.raises(ACPError) as caught:
            await v2.call("session.show", session_id="nope")
        assert caught.value.code == "NOT_FOUND"
        bob = ACPClient(transport, acp_version="2.0", token=served.tokens.tokens["bob"], contract=v1_and_v2)
        with pytest.raises(ACPError) as caught:
            await bob.call("session.show", session_id=served.session_id)
        assert caught.value.code == "NOT_FOUND"
        assert caught.value.details["refinement"] == "SESSION_NOT_FOUND"
    finally:
        await transport.close()


@pytest.mark.parametrize("kind", ["http", "grpc"])
async def test_streams_of_the_second_major(served: Served, v1_and_v2: Catalog, kind: str) -> None:
    """SSE (the HTTP transport reads /api/v2/events/stream) and a gRPC server stream."""
    if kind == "http":
        transport: HTTPTransport | GrpcTransport = HTTPTransport.connect(served.server.http)
    else:
        transport = GrpcTransport.connect(served.server.grpc_target)
    v2 = ACPClient(transport, acp_version="2.0", token=served.alice, contract=v1_and_v2)
    try:
        events = v2.subscribe(session_id=served.session_id)
        try:
            first = await anext(events)
        finally:
            await events.aclose()  # type: ignore[attr-defined]
        assert first.session_id == served.session_id
        refused = ACPClient(transport, acp_version="2.1", token=served.alice, contract=v1_and_v2).subscribe()
        with pytest.raises(ACPError) as caught:
            await anext(refused)
        assert caught.value.code == "VERSION_MISMATCH"
    finally:
        await transport.close()


async def test_sse_of_the_second_major(served: Served, http: httpx.AsyncClient) -> None:
    url = "/api/v2/events/stream"
    async with http.stream("GET", url, params={"session_id": served.session_id}) as answer:
        assert (answer.status_code, answer.headers["ACP-Version"]) == (200, "2.0")
        assert answer.headers["content-type"].startswith("text/event-stream")
        data = None
        async for line in answer.aiter_lines():
            if line.startswith("data:"):
                data = json.loads(line.removeprefix("data:"))
                break
    assert data is not None
    assert data["session_id"] == served.session_id
    older = await http.get(url, headers={"ACP-Version": "1.2"})
    assert older.json()["error"]["code"] == "VERSION_MISMATCH"


async def test_grpc_serves_the_second_package_and_refuses_unknown_methods(served: Served) -> None:
    async with grpc.aio.insecure_channel(served.server.grpc_target) as channel:
        unknown: Any = channel.unary_unary("/cleveragents.acp.v2.SessionService/ListSessions", None, None)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await unknown(b"", metadata=(("authorization", f"Bearer {served.alice}"),), timeout=TIMEOUT)
        assert caught.value.code() == grpc.StatusCode.NOT_FOUND
        trailers: dict[str, Any] = dict(caught.value.trailing_metadata() or ())  # type: ignore[arg-type]
        err = rich_status.from_status(
            caught.value.code(), caught.value.details() or "", trailers.get(rich_status.DETAILS_KEY)
        )
        assert (err.code, err.details) == (
            "NOT_FOUND",
            {"method": "/cleveragents.acp.v2.SessionService/ListSessions"},
        )


def _cli_args(served: Served, mode: str) -> Sequence[str]:
    if mode == "http":
        return ["--server", served.server.http, "--token", served.alice]
    if mode == "grpc":
        return ["--grpc", served.server.grpc_target, "--token", served.alice]
    return ["--db", str(served.directory / "local.db")]


@pytest.mark.parametrize("mode", ["local", "http", "grpc"])
def test_the_cli_chooses_the_major_by_acp_version(served: Served, mode: str) -> None:
    connection = _cli_args(served, mode)
    session_id = served.session_id
    if mode == "local":
        session_id = served.cli(*connection, "session", "create", "--value", "session.meta.id").stdout.strip()
        served.cli(*connection, "session", "tell", session_id, "/help")
    v2 = json.loads(
        served.cli(*connection, "--acp-version", "2.0", "session", "show", session_id, "--json").stdout
    )
    _v2_shape(v2, session_id)
    v1 = json.loads(served.cli(*connection, "session", "show", session_id, "--json").stdout)
    _v1_shape(v1)
    human = served.cli(*connection, "--acp-version", "2.0", "session", "show", session_id).stdout
    assert "latest_message" in human or "latest message" in human
    missing = served.cli(
        *connection, "--acp-version", "2.0", "session", "list", expect=errors.exit_code("NOT_FOUND")
    )
    assert "ACP 2" in missing.stderr
    refused = served.cli(
        *connection,
        "--acp-version",
        "2.1",
        "session",
        "show",
        session_id,
        expect=errors.exit_code("VERSION_MISMATCH"),
    )
    assert "2.0" in refused.stderr


@pytest.mark.parametrize("mode", ["http", "grpc"])
def test_an_operation_only_a_later_major_has_is_a_command(served: Served, mode: str) -> None:
    """Called in its major unless the connection names a version that lacks it."""
    connection = _cli_args(served, mode)
    session_id = served.session_id
    counted = json.loads(served.cli(*connection, "session", "count", session_id, "--json").stdout)
    assert counted == {"message_count": 2}
    named = served.cli(*connection, "--acp-version", "2.0", "session", "count", session_id, "--json")
    assert json.loads(named.stdout) == counted
    lacking = served.cli(
        *connection,
        "--acp-version",
        "1.2",
        "session",
        "count",
        session_id,
        expect=errors.exit_code("NOT_FOUND"),
    )
    assert "session.count" in lacking.stderr


async def test_meta_version_names_every_major_served(http: httpx.AsyncClient) -> None:
    for spoken in ("1.3", "1.2", "1.1"):
        body = {"operation": "meta.version", "params": {}, "acp_version": spoken}
        answer = (await http.post("/api/v1/acp", json=body)).json()
        assert answer["status"] == "ok", answer
        assert answer["data"]["supported_versions"] == ["2.0", "1.3", "1.2", "1.1"]
        assert answer["data"]["current_version"] == "1.3"


async def test_the_openapi_document_describes_every_major(http: httpx.AsyncClient) -> None:
    document = (await http.get("/api/v1/openapi.json")).json()
    assert document["info"]["x-acp-versions"] == ["2.0", "1.3", "1.2", "1.1"]
    paths = document["paths"]
    v2_envelope = paths["/api/v2/acp"]["post"]
    assert v2_envelope["operationId"] == "acp.envelope.v2"
    assert paths["/api/v1/acp"]["post"]["operationId"] == "acp.envelope"
    enum = v2_envelope["requestBody"]["content"]["application/json"]["schema"]["allOf"][1]["properties"]
    assert enum["operation"]["enum"] == ["session.count", "session.show"]
    v2_show = paths["/api/v2/sessions/{session_id}"]["get"]
    v1_show = paths["/api/v1/sessions/{session_id}"]["get"]
    assert (v2_show["operationId"], v1_show["operationId"]) == ("session.show.v2", "session.show")
    version = {p["name"]: p for p in v2_show["parameters"]}["ACP-Version"]
    assert version["schema"]["enum"] == ["2.0"]
    v2_data = v2_show["responses"]["200"]["content"]["application/json"]["schema"]
    assert "cleveragents.acp.v2.GetSessionResponse" in json.dumps(v2_data)
    ids = [op["operationId"] for item in paths.values() for op in item.values()]
    assert len(ids) == len(set(ids)), "operationIds must be unique"
