"""No caller's regex or glob stalls the others, on a real server (subprocess, token auth).

While one namespace sends what made a backtracking engine run for seconds (an
``inputs_schema`` pattern ``^(a+)+$`` with a long input, a context glob of ten ``**/``
segments over a deep folder), another namespace's ``session.show`` keeps answering, and the
pathological call itself answers quickly. The sizes are far past what backtracking could
finish (``^(a+)+$`` took 3.2 s at 26 characters, doubling per character), so the generous
bounds below separate the two behaviours without timing anything tightly.
"""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import httpx
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import context_pb2, session_pb2
from tests.server_process import ServerProcess, Tokens, start_server

# What the probe and the pathological calls must each stay under: seconds, on a loaded machine.
PROMPT_SECONDS = 3.0
ROUNDS = 5
CALL_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Tokens, pathlib.Path]]:
    directory = tmp_path_factory.mktemp("caller-cpu")
    tokens = Tokens.create(directory)
    folder = directory / "deep"
    leaf = folder.joinpath(*["d"] * 40)
    leaf.mkdir(parents=True)
    (leaf / "xyz.txt").write_text("deep\n")
    server = start_server(directory, tokens=tokens.path)
    yield server, tokens, folder
    assert server.stop() == 0, server.stderr()


@pytest.fixture
async def clients(
    server: tuple[ServerProcess, Tokens, pathlib.Path],
) -> AsyncIterator[tuple[ACPClient, ACPClient]]:
    process, tokens, _ = server

    def client(principal: str) -> ACPClient:
        http = httpx.AsyncClient(base_url=process.http, timeout=CALL_TIMEOUT)
        return ACPClient(HTTPTransport(http, owns_client=True), token=tokens.tokens[principal])

    alice, bob = client("alice"), client("bob")
    try:
        yield alice, bob
    finally:
        await alice.close()
        await bob.close()


async def probe_while(alice: ACPClient, pathological: Callable[[], Awaitable[float]]) -> None:
    """Run ``pathological`` ROUNDS times while alice shows her session over and over."""
    created = await alice.call("session.create", namespace="default", title="probe")
    assert isinstance(created, session_pb2.CreateSessionResponse)
    latencies: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            began = time.monotonic()
            await alice.call("session.show", session_id=created.session.meta.id)
            latencies.append(time.monotonic() - began)
            await asyncio.sleep(0.02)

    prober = asyncio.create_task(probe())
    try:
        for _ in range(ROUNDS):
            assert await pathological() < PROMPT_SECONDS
    finally:
        done.set()
        await asyncio.wait_for(prober, CALL_TIMEOUT)
    assert latencies, "the probe never answered"
    assert max(latencies) < PROMPT_SECONDS, latencies


async def add_project(bob: ACPClient, folder: pathlib.Path, name: str) -> None:
    spec = {"type": "directory", "path": str(folder)}
    await bob.call("resource.add", namespace="other", name=name, spec=spec)
    await bob.call("project.add", namespace="other", name=name, spec={"resources": [name]})


async def test_a_redos_inputs_schema_pattern_holds_no_other_namespace(
    server: tuple[ServerProcess, Tokens, pathlib.Path], clients: tuple[ACPClient, ACPClient]
) -> None:
    alice, bob = clients
    await add_project(bob, server[2], "redos")
    schema = {"type": "object", "properties": {"word": {"type": "string", "pattern": "^(a+)+$"}}}
    await bob.call(
        "action.add", namespace="other", name="redos", spec={"actor": "scripted", "inputs_schema": schema}
    )

    async def use() -> float:
        began = time.monotonic()
        inputs = {"word": "a" * 60 + "!"}
        with pytest.raises(ACPError) as caught:
            await bob.call("plan.use", namespace="other", action="redos", project="redos", inputs=inputs)
        assert caught.value.code == "INVALID_PARAMS"
        assert "does not match '^(a+)+$'" in caught.value.message
        return time.monotonic() - began

    await probe_while(alice, use)


async def test_a_backreference_is_refused_at_registration_naming_the_field(
    clients: tuple[ACPClient, ACPClient],
) -> None:
    _, bob = clients
    schema = {"properties": {"word": {"pattern": "^(a+)\\1$"}}}
    with pytest.raises(ACPError) as caught:
        await bob.call(
            "action.add",
            namespace="other",
            name="backref",
            spec={"actor": "scripted", "inputs_schema": schema},
        )
    assert caught.value.code == "INVALID_PARAMS"
    assert caught.value.details["field"] == "spec.inputs_schema"
    assert caught.value.details["schema_path"] == "properties/word/pattern"


async def test_a_deep_glob_holds_no_other_namespace(
    server: tuple[ServerProcess, Tokens, pathlib.Path], clients: tuple[ACPClient, ACPClient]
) -> None:
    alice, bob = clients
    await add_project(bob, server[2], "globs")
    config = {"sources": [{"resource": "globs", "globs": ["**/" * 10 + "x*y*z*w"]}]}
    await bob.call("context.set", namespace="other", project="globs", config=config)

    async def simulate() -> float:
        began = time.monotonic()
        answer = await bob.call("context.simulate", namespace="other", project="globs", prompt="p")
        assert isinstance(answer, context_pb2.SimulateContextResponse)
        assert [item.id for item in answer.items] == ["prompt"]
        return time.monotonic() - began

    await probe_while(alice, simulate)
