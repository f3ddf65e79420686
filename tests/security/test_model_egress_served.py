"""The real ``agents serve`` with a writer's token, over the HTTP envelope and gRPC: an actor
aimed at a server the caller controls, or naming one of the server's variables as its key,
is refused; the operator's endpoint and key variable work against the fake OpenAI server;
after the operator narrows the lists, the actor registered before is refused at use."""

from __future__ import annotations

import pathlib
from collections.abc import Iterator

import httpx
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade import auth
from cleveragents.acp.v1 import plan_pb2
from tests.facade.plans.helpers import run, use
from tests.facade.plans.model_world import KEY, KEY_ENV, model_world
from tests.fake_openai import FakeOpenAI, turn
from tests.server_process import ServerProcess, start_server

SECRET_ENV = "ACP_TEST_SERVER_SECRET"
SECRET = "postgresql://admin:hunter2@db.internal/prod"
ENV = {KEY_ENV: KEY, SECRET_ENV: SECRET, "ACP_MODEL_BACKOFF_SECONDS": "0.01"}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start_in_thread()
    yield server
    server.stop_thread()


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, fake: FakeOpenAI
) -> Iterator[tuple[ServerProcess, str, pathlib.Path]]:
    directory = tmp_path_factory.mktemp("served-models")
    tokens = directory / "tokens.toml"
    token = auth.create_token(tokens, "bob", ["http", "grpc"], role="writer")
    lists = ["--model-endpoint", fake.base_url, "--model-key-env", KEY_ENV]
    server = start_server(directory, *lists, tokens=tokens, env=ENV, roots=[directory])
    yield server, token, directory
    assert server.stop() == 0, server.stderr()


def connect(server: ServerProcess, kind: str, token: str) -> ACPClient:
    transport = (
        HTTPTransport(httpx.AsyncClient(base_url=server.http, timeout=30), owns_client=True)
        if kind == "http"
        else GrpcTransport.connect(server.grpc_target, timeout=30)
    )
    return ACPClient(transport, token=token)


@pytest.mark.parametrize("kind", ["http", "grpc"])
async def test_a_writer_cannot_send_the_servers_secrets_anywhere(
    served: tuple[ServerProcess, str, pathlib.Path], fake: FakeOpenAI, kind: str
) -> None:
    server, token, directory = served
    client = connect(server, kind, token)
    before = len(fake.requests)
    port = fake.base_url.split(":")[2].split("/")[0]
    attempts = [
        ("http://attacker.example:8080/v1", KEY_ENV, "spec.base_url"),
        ("http://169.254.169.254/latest", "", "spec.base_url"),
        (f"http://127.0.0.1:{port}@attacker.example/v1", KEY_ENV, "spec.base_url"),
        (f"http://127.0.0.1:{port}/v1evil", KEY_ENV, "spec.base_url"),
        (fake.base_url, SECRET_ENV, "spec.api_key_env"),
        (fake.base_url, "ACP_TEST_NO_SUCH_VARIABLE_ANYWHERE", "spec.api_key_env"),
    ]
    messages: dict[str, set[str]] = {"spec.base_url": set(), "spec.api_key_env": set()}
    try:
        for base_url, key_env, field in attempts:
            spec = {"provider": "openai", "model": "m", "base_url": base_url, "api_key_env": key_env}
            with pytest.raises(ACPError) as info:
                await client.call("actor.add", namespace=kind, name="exfil", spec=spec)
            assert info.value.code == "INVALID_PARAMS"
            assert info.value.details["field"] == field
            assert SECRET not in info.value.message
            messages[field].add(info.value.message)
        # The same answer whatever the variable: nothing to learn of the environment.
        assert len(messages["spec.api_key_env"]) == 1

        await model_world(client, directory / f"project-{kind}", fake.base_url, namespace=kind)
        fake.then(turn("Nothing to change here."))
        done = await run(client, (await use(client, namespace=kind)).meta.id)
        assert done.state == plan_pb2.PLAN_STATE_SUCCEEDED, done.last_error
    finally:
        await client.close()
    sent = fake.requests[before:]
    assert [r.path for r in sent] == ["/v1/chat/completions"]
    assert sent[0].headers["authorization"] == f"Bearer {KEY}"


async def test_an_actor_is_refused_at_use_after_the_operator_narrows_the_lists(
    tmp_path: pathlib.Path, fake: FakeOpenAI
) -> None:
    tokens = tmp_path / "tokens.toml"
    token = auth.create_token(tokens, "bob", ["grpc"], role="writer")
    lists = ["--model-endpoint", fake.base_url, "--model-key-env", KEY_ENV]
    server = start_server(tmp_path, *lists, tokens=tokens, env=ENV, roots=[tmp_path])
    client = connect(server, "grpc", token)
    try:
        await model_world(client, tmp_path / "project", fake.base_url, namespace="grpc")
    finally:
        await client.close()
        assert server.stop() == 0, server.stderr()
    before = len(fake.requests)
    server = start_server(
        tmp_path, "--model-endpoint", fake.base_url, tokens=tokens, env=ENV, roots=[tmp_path]
    )
    client = connect(server, "grpc", token)
    try:
        with pytest.raises(ACPError) as info:
            await use(client, namespace="grpc")
        assert info.value.code == "INVALID_PARAMS"
        assert info.value.details["refinement"] == "MODEL_ENDPOINT_REFUSED"
        assert "--model-key-env" in info.value.message
    finally:
        await client.close()
        assert server.stop() == 0, server.stderr()
    assert len(fake.requests) == before
