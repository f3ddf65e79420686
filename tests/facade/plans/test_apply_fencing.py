"""Issue 30 item 3: apply checks its lease before each file (and each rename).

A holder frozen mid-apply (here: paused after file 2 of 6, its heartbeat stopped, as a
SIGSTOP would) loses its lease to another process, which restores the checkpoint and
records the apply as interrupted. When the holder wakes it writes no further file, and
its caller gets INVALID_STATE LEASE_LOST (retryable) naming the new holder: the taker's
restore is final.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.plans import apply, leases, model
from cleveragents.acp.facade.domain.plans.engine import PlanEngine
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.service_facade import ServiceFacade
from tests import postgres
from tests.facade.plans.helpers import (
    add_action,
    add_project,
    eventually,
    run,
    snapshot,
    use,
    wait_for,
    write_tree,
)

FILES = 6
PAUSED_AFTER = 2


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield str(tmp_path / "shared.db")
        return
    with postgres.fresh_schema("fencing") as url:
        yield url


@dataclass
class Pair:
    """Two engines on one database, as two server processes would be."""

    facades: tuple[ServiceFacade, ServiceFacade]
    clients: tuple[ACPClient, ACPClient]


@pytest.fixture
async def two(database: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Pair]:
    monkeypatch.setenv(leases.TTL_ENV, "1")
    facades = (open_facade(database, takeover=True), open_facade(database, takeover=True))
    clients = (
        ACPClient(LocalTransport(facades[0], owns_facade=True)),
        ACPClient(LocalTransport(facades[1], owns_facade=True)),
    )
    try:
        yield Pair(facades, clients)
    finally:
        for client in clients:
            await client.close()


def _engine(facade: ServiceFacade) -> PlanEngine:
    return next(r for r in facade._resources if isinstance(r, PlanEngine))


async def test_a_holder_that_lost_its_lease_mid_apply_writes_no_further_file(
    tmp_path: pathlib.Path, two: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = two.clients
    folder = tmp_path / "repo"
    write_tree(folder, {"keep.txt": b"kept\n"})
    await add_project(first, folder)
    steps = [{"tool": "fs.write", "args": {"path": f"f{i}.txt", "content": "plan"}} for i in range(FILES)]
    await add_action(first, steps=steps)
    plan_id = (await run(first, (await use(first, {})).meta.id)).meta.id
    original = snapshot(folder)

    pause = tmp_path / "pause"
    pause.write_text(str(PAUSED_AFTER))
    monkeypatch.setenv(apply.PAUSE_ENV, str(pause))
    applying = asyncio.ensure_future(first.call("plan.apply", plan_id=plan_id))

    async def paused() -> bool:
        return (tmp_path / f"pause.{PAUSED_AFTER}").exists()

    await eventually(paused)
    assert sorted(p.name for p in folder.iterdir()) == ["f0.txt", "f1.txt", "keep.txt"]
    # Frozen: the holder stops renewing; the other engine takes the plan over and restores.
    stale = _engine(two.facades[0])
    assert stale.keeper.heartbeat is not None
    stale.keeper.heartbeat.cancel()
    failed = await wait_for(second, plan_id, model.FAILED)
    assert failed.last_error.code == model.INTERRUPTED
    assert snapshot(folder) == original

    pause.write_text("go")
    with pytest.raises(ACPError) as info:
        await applying
    assert snapshot(folder) == original, "the stale holder wrote after the takeover"
    assert not any(name.startswith(".acp-apply-") for name in os.listdir(folder))
    assert info.value.code == "INVALID_STATE"
    assert info.value.details["refinement"] == "LEASE_LOST"
    assert info.value.details["retryable"] is True
    assert "released" in info.value.details["holder"] or "pid" in info.value.details["holder"]
    # The taker's record stands: the stale holder recorded nothing over it.
    assert (await wait_for(second, plan_id, model.FAILED)).last_error.code == model.INTERRUPTED
