"""Issue 17, model egress: in server mode a model actor may send requests only to the
operator's endpoints and read its key only from the operator's variables, checked at
registration, at ``plan.use``, and before every request (an actor registered before the
operator narrowed the lists); URLs are compared after normalisation, redirects are not
followed, and refusals tell nothing of the server's environment or hosts."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator, Sequence

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.access.policy import Policy
from cleveragents.acp.facade.domain.models.client import ChatModels
from cleveragents.acp.facade.domain.models.egress import ModelEgress
from cleveragents.acp.facade.domain.models.failures import ModelError
from cleveragents.acp.facade.domain.models.settings import ModelSettings
from cleveragents.acp.facade.factory import open_facade, server_policy
from cleveragents.acp.v1 import plan_pb2, specs_pb2
from tests.facade.plans.helpers import run, use
from tests.facade.plans.model_world import ACTOR, KEY, KEY_ENV, model_world
from tests.fake_openai import FakeOpenAI, Json, turn

SECRET_ENV = "ACP_TEST_SERVER_SECRET"
SECRET = "postgresql://admin:hunter2@db.internal/prod"
ABSENT_ENV = "ACP_TEST_NO_SUCH_VARIABLE_ANYWHERE"
EVIL = "http://attacker.example:8080/v1"


@pytest.fixture
async def fake(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeOpenAI]:
    monkeypatch.setenv(KEY_ENV, KEY)
    monkeypatch.setenv(SECRET_ENV, SECRET)
    monkeypatch.delenv(ABSENT_ENV, raising=False)
    async with FakeOpenAI() as server:
        yield server


def served(
    tmp_path: pathlib.Path, endpoints: Sequence[str] = (), key_envs: Sequence[str] = ()
) -> tuple[ACPClient, object]:
    policy = Policy.server([str(tmp_path)], model_endpoints=endpoints, model_key_envs=key_envs)
    facade = open_facade(tmp_path / "acp.db", policy=policy)
    return ACPClient(LocalTransport(facade)), facade


async def closed(client: ACPClient, facade: object) -> None:
    await client.close()
    await facade.close()  # type: ignore[attr-defined]


async def refused_actor(client: ACPClient, spec: dict[str, str], name: str = "probe") -> ACPError:
    with pytest.raises(ACPError) as info:
        await client.call("actor.add", name=name, spec={"provider": "openai", "model": "m", **spec})
    assert info.value.code == "INVALID_PARAMS"
    return info.value


async def test_server_mode_without_lists_refuses_model_actors_saying_how_to_allow_them(
    tmp_path: pathlib.Path, fake: FakeOpenAI
) -> None:
    client, facade = served(tmp_path)
    try:
        endpoint = await refused_actor(client, {"base_url": fake.base_url})
        assert endpoint.details["field"] == "spec.base_url"
        assert "--model-endpoint" in endpoint.message
        key = await refused_actor(client, {"base_url": fake.base_url, "api_key_env": SECRET_ENV})
        assert key.details["field"] == "spec.base_url"
        # The scripted actors need no endpoint: they stay usable.
        await client.call("actor.add", name="plain", spec={"provider": "scripted"})
    finally:
        await closed(client, facade)
    assert fake.requests == []


async def test_the_exfiltration_attempt_is_refused_and_tells_nothing_of_the_environment(
    tmp_path: pathlib.Path, fake: FakeOpenAI
) -> None:
    client, facade = served(tmp_path, [fake.base_url], [KEY_ENV])
    try:
        to_evil = await refused_actor(client, {"base_url": EVIL, "api_key_env": KEY_ENV})
        assert to_evil.details["field"] == "spec.base_url"
        assert "attacker" not in to_evil.message
        assert "127.0.0.1" not in to_evil.message
        existing = await refused_actor(client, {"base_url": fake.base_url, "api_key_env": SECRET_ENV})
        absent = await refused_actor(client, {"base_url": fake.base_url, "api_key_env": ABSENT_ENV})
        assert existing.details["field"] == absent.details["field"] == "spec.api_key_env"
        assert existing.message == absent.message
        assert "--model-key-env" in existing.message
        assert SECRET not in existing.message
        assert KEY_ENV not in existing.message
        # An update cannot do what an add may not.
        spec = {"provider": "openai", "model": "m", "base_url": fake.base_url, "api_key_env": KEY_ENV}
        await client.call("actor.add", name="ok", spec=spec)
        with pytest.raises(ACPError) as info:
            await client.call("actor.update", name="ok", revision=1, spec={**spec, "api_key_env": SECRET_ENV})
        assert info.value.details["field"] == "spec.api_key_env"
    finally:
        await closed(client, facade)
    assert fake.requests == []


async def test_an_allowed_endpoint_and_key_run_a_plan_on_the_real_wire_format(
    tmp_path: pathlib.Path, fake: FakeOpenAI
) -> None:
    # Listed in another spelling: compared after normalisation.
    allowed = fake.base_url.replace("http://127.0.0.1", "HTTP://127.0.0.1") + "/"
    client, facade = served(tmp_path, [allowed], [KEY_ENV])
    try:
        await model_world(client, tmp_path / "project", fake.base_url + "/")
        fake.then(turn("Nothing to change."))
        done = await run(client, (await use(client)).meta.id)
        assert done.state == plan_pb2.PLAN_STATE_SUCCEEDED, done.last_error
    finally:
        await closed(client, facade)
    assert [r.path for r in fake.requests] == ["/v1/chat/completions"]
    assert fake.requests[0].headers["authorization"] == f"Bearer {KEY}"


async def test_an_actor_registered_before_the_lists_narrowed_is_refused_at_use(
    tmp_path: pathlib.Path, fake: FakeOpenAI
) -> None:
    client, facade = served(tmp_path, [fake.base_url], [KEY_ENV])
    try:
        await model_world(client, tmp_path / "project", fake.base_url)
        await client.call(
            "actor.add",
            name="chat",
            spec={"provider": "openai", "model": "m", "base_url": fake.base_url, "api_key_env": KEY_ENV},
        )
        created = await client.call("session.create", project="proj", orchestrator="chat")
        session_id = created.session.meta.id  # type: ignore[attr-defined]
        earlier = [await use(client), await use(client)]
    finally:
        await closed(client, facade)
    # The operator drops the key variable, or the endpoint.
    narrowed: tuple[tuple[list[str], list[str], str], ...] = (
        ([fake.base_url], [], "spec.api_key_env"),
        ([], [KEY_ENV], "spec.base_url"),
    )
    for plan, (endpoints, key_envs, field) in zip(earlier, narrowed, strict=True):
        client, facade = served(tmp_path, endpoints, key_envs)
        try:
            with pytest.raises(ACPError) as info:
                await use(client)
            assert info.value.code == "INVALID_PARAMS"
            assert info.value.details["refinement"] == "MODEL_ENDPOINT_REFUSED"
            assert info.value.details["refused"] == field
            assert f"actor {ACTOR!r}" in info.value.message
            with pytest.raises(ACPError) as told:
                await client.call("session.tell", session_id=session_id, content="hi")
            assert told.value.code == "INVALID_PARAMS"
            assert told.value.details["refinement"] == "MODEL_ENDPOINT_REFUSED"
            assert told.value.details["field"] == field
            done = await run(client, plan.meta.id)
            assert done.state == plan_pb2.PLAN_STATE_FAILED
            assert done.last_error.code == "model_endpoint_refused"
            assert field in done.last_error.message
        finally:
            await closed(client, facade)
    assert fake.requests == []


ALLOWED = "http://allowed.example/v1"


@pytest.mark.parametrize(
    ("given", "allowed"),
    [
        ("http://allowed.example/v1", True),
        ("HTTP://ALLOWED.Example:80/v1/", True),
        ("http://allowed.example./v1/deployments/x", True),
        ("http://allowed.example/v1evil", False),
        ("http://allowed.example/v2", False),
        ("http://allowed.example/", False),
        ("http://allowed.example:443/v1", False),
        ("https://allowed.example/v1", False),
        ("http://allowed.example@evil.example/v1", False),
        ("http://user:pw@allowed.example/v1", False),
        ("http://evil.example#@allowed.example/v1", False),
        ("http://allowed.example\\@evil.example/v1", False),
        ("http://allowed.example/v1/../admin", False),
        ("http://allowed.example/v1/%2e%2e/admin", False),
        ("http://allowed.example/v1?x=1", False),
        ("http://allowed.example.evil.example/v1", False),
        ("http://allowed.example:8o/v1", False),
    ],
)
def test_urls_are_compared_after_normalisation(given: str, allowed: bool) -> None:
    egress = ModelEgress.configured([ALLOWED], [], required=True)
    verdict = egress.verdict(given, "")
    assert (verdict.field is None) is allowed, verdict
    if allowed:
        assert verdict.url.startswith(ALLOWED)


@pytest.mark.parametrize(
    ("listed", "given", "allowed"),
    [
        ("http://[::1]:8080/v1", "http://[0:0:0:0:0:0:0:1]:8080/v1", True),
        ("http://[::1]:8080/v1", "http://[::2]:8080/v1", False),
        ("http://[::1]:8080/v1", "http://[::1]/v1", False),
        ("https://[2001:db8::1]/v1", "HTTPS://[2001:DB8:0::1]:443/v1/", True),
        ("http://127.0.0.1:9000", "http://127.0.0.1:9000/v1", True),
        ("http://127.0.0.1:9000", "http://2130706433:9000/v1", False),
        ("http://127.0.0.1:9000", "http://0x7f.0.0.1:9000/v1", False),
        ("http://127.0.0.1:9000", "http://0177.0.0.1:9000/v1", False),
        ("http://127.0.0.1:9000", "http://localhost:9000/v1", False),
    ],
)
def test_ip_literals_are_compared_in_their_canonical_form(listed: str, given: str, allowed: bool) -> None:
    verdict = ModelEgress.configured([listed], [], required=True).verdict(given, "")
    assert (verdict.field is None) is allowed, verdict


def test_the_operators_lists_are_checked_when_the_server_starts() -> None:
    for bad in ("http://u@allowed.example/v1", "ftp://allowed.example", "http://allowed.example/a/../b"):
        with pytest.raises(ValueError, match="--model-endpoint"):
            server_policy([], allow_commands=False, command_user=None, model_endpoints=[bad])
    with pytest.raises(ValueError, match="--model-key-env"):
        server_policy([], allow_commands=False, command_user=None, model_key_envs=["NOT A NAME"])


async def test_local_mode_restricts_nothing_unless_configured(
    tmp_path: pathlib.Path, fake: FakeOpenAI
) -> None:
    assert Policy.local({}).models.verdict(EVIL, SECRET_ENV).field is None
    narrowed = Policy.local({"ACP_MODEL_ENDPOINTS": fake.base_url, "ACP_MODEL_KEY_ENVS": KEY_ENV})
    assert narrowed.models.verdict(EVIL, KEY_ENV).field == "spec.base_url"
    assert narrowed.models.verdict(fake.base_url, SECRET_ENV).field == "spec.api_key_env"
    facade = open_facade(tmp_path / "acp.db", policy=Policy.local({}))
    client = ACPClient(LocalTransport(facade))
    try:
        await client.call(
            "actor.add",
            name="anywhere",
            spec={"provider": "openai", "model": "m", "base_url": EVIL, "api_key_env": SECRET_ENV},
        )
    finally:
        await closed(client, facade)


async def test_a_redirect_is_not_followed_to_another_host(fake: FakeOpenAI) -> None:
    async with FakeOpenAI() as elsewhere:
        fake.then(Json({}, 307, {"location": f"{elsewhere.base_url}/chat/completions"}))
        egress = ModelEgress.configured([fake.base_url], [KEY_ENV], required=True)
        models = ChatModels(ModelSettings(retries=0), {KEY_ENV: KEY}, egress)
        spec = specs_pb2.ActorSpec(provider="openai", model="m", base_url=fake.base_url, api_key_env=KEY_ENV)

        async def emit(index: int, text: str) -> None:
            return None

        try:
            with pytest.raises(ModelError) as info:
                await models.stream(ACTOR, spec, [{"role": "user", "content": "hi"}], [], emit)
        finally:
            await models.close()
        assert "307" in info.value.message
        assert len(fake.requests) == 1
        assert elsewhere.requests == []
