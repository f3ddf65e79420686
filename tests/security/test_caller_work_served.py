"""One tenant's heavy schema work never starves another's, on a real server (subprocess).

Bob's action has an ``inputs_schema`` whose check makes millions of steps; he sends eight
``plan.use`` calls with it at once (the attack filled the server's shared thread pool:
other tenants waited 40 to 150 s). Alice's ``plan.use`` must then answer before any of
bob's: his calls take their namespace's places on the caller-work pool, each stops at the
step budget, and hers gets a thread of its own at once. Bob then abandons his calls: they
stop, and his own next call answers. Before the fix bob's calls held every thread of the
loop's default pool and hers waited behind them. Nothing here is timed: the order of the
answers is the observable, with generous timeouts only against a hang.

Then: a check past the step budget answers INVALID_PARAMS saying so; a ``uniqueItems``
over thousands of objects (quadratic in the library) answers, with the duplicate it found.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import plan_pb2
from tests.server_process import ServerProcess, Tokens, start_server

CALL_TIMEOUT = 90.0
ATTACKS = 8
# Items of bob's document: about 150 steps each under his schema (49 failing branches of the
# anyOf first), far past the step budget.
ITEMS = 20_000
HEAVY = {
    "type": "object",
    "properties": {
        "xs": {
            "type": "array",
            "items": {"anyOf": [{"type": "string", "minLength": n} for n in range(50, 0, -1)]},
        }
    },
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Tokens, pathlib.Path]]:
    directory = tmp_path_factory.mktemp("caller-work")
    tokens = Tokens.create(directory)
    folder = directory / "project"
    folder.mkdir()
    server = start_server(directory, tokens=tokens.path)
    yield server, tokens, folder
    assert server.stop() == 0, server.stderr()


@pytest.fixture
async def clients(
    server: tuple[ServerProcess, Tokens, pathlib.Path],
) -> AsyncIterator[tuple[ACPClient, ACPClient]]:
    process, tokens, _ = server
    limits = httpx.Limits(max_connections=ATTACKS + 2)

    def client(principal: str) -> ACPClient:
        http = httpx.AsyncClient(base_url=process.http, timeout=CALL_TIMEOUT, limits=limits)
        return ACPClient(HTTPTransport(http, owns_client=True), token=tokens.tokens[principal])

    alice, bob = client("alice"), client("bob")
    try:
        yield alice, bob
    finally:
        await alice.close()
        await bob.close()


async def add_action(
    client: ACPClient, namespace: str, folder: pathlib.Path, schema: Mapping[str, Any]
) -> None:
    await client.call(
        "resource.add", namespace=namespace, name="p", spec={"type": "directory", "path": str(folder)}
    )
    await client.call("project.add", namespace=namespace, name="p", spec={"resources": ["p"]})
    await client.call(
        "action.add", namespace=namespace, name="a", spec={"actor": "scripted", "inputs_schema": schema}
    )


def cpu_seconds(pid: int) -> float:
    """The process's user and system CPU time (``/proc/<pid>/stat``)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def busy(pid: int, seconds: float) -> None:
    """Wait until the server has spent ``seconds`` more CPU: bob's checks are running."""
    start = cpu_seconds(pid)
    async with asyncio.timeout(CALL_TIMEOUT):
        while True:
            if cpu_seconds(pid) - start >= seconds:
                return
            await asyncio.sleep(0.05)


async def test_heavy_schemas_of_one_namespace_leave_another_answered(
    server: tuple[ServerProcess, Tokens, pathlib.Path], clients: tuple[ACPClient, ACPClient]
) -> None:
    process, _, folder = server
    alice, bob = clients
    await add_action(bob, "other", folder, HEAVY)
    light = {"type": "object", "properties": {"n": {"type": "integer"}}}
    await bob.call(
        "action.add", namespace="other", name="light", spec={"actor": "scripted", "inputs_schema": light}
    )
    await add_action(alice, "default", folder, light)
    answered: list[str] = []

    async def attack() -> None:
        try:
            await bob.call(
                "plan.use", namespace="other", action="a", project="p", inputs={"xs": ["a"] * ITEMS}
            )
        finally:
            answered.append("bob")

    attacks = [asyncio.create_task(attack()) for _ in range(ATTACKS)]
    await busy(process.process.pid, 2.0)
    used = await alice.call("plan.use", namespace="default", action="a", project="p", inputs={"n": 1})
    assert isinstance(used, plan_pb2.UsePlanResponse)
    assert answered == [], "bob's heavy checks answered before alice's light one"
    # Bob gives up: his connections close, his checks stop at their next step and give his
    # namespace's places back, so his own next call runs.
    for task in attacks:
        task.cancel()
    await asyncio.gather(*attacks, return_exceptions=True)
    again = await bob.call("plan.use", namespace="other", action="light", project="p", inputs={"n": 2})
    assert isinstance(again, plan_pb2.UsePlanResponse)


async def test_a_check_past_the_step_budget_is_refused_saying_so(
    clients: tuple[ACPClient, ACPClient],
) -> None:
    _, bob = clients
    with pytest.raises(ACPError) as caught:
        await bob.call("plan.use", namespace="other", action="a", project="p", inputs={"xs": ["a"] * ITEMS})
    assert caught.value.code == "INVALID_PARAMS"
    assert "steps of work; send a smaller document or a simpler schema" in caught.value.message


async def test_unique_items_over_thousands_of_objects_answers(
    clients: tuple[ACPClient, ACPClient],
) -> None:
    alice, _ = clients
    schema = {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}
    await alice.call(
        "action.add", namespace="default", name="unique", spec={"actor": "scripted", "inputs_schema": schema}
    )
    items = [{"a": n} for n in range(20_000)]
    with pytest.raises(ACPError) as caught:
        await alice.call(
            "plan.use", namespace="default", action="unique", project="p", inputs={"xs": [*items, {"a": 7}]}
        )
    assert caught.value.code == "INVALID_PARAMS"
    assert "non-unique elements (items 7 and 20000)" in caught.value.message
