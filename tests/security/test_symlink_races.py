"""Issue 17 findings 3 and 4: apply, rollback (with force) and recovery walk every path
from a descriptor of the resource folder without following symlinks, so a folder swapped
for a symlink to an outside folder, at any moment, never gets a write or a delete there.

A thread swaps the folder in a loop while the file work runs; the loops are bounded by a
count and a few seconds, and the outside folder (with a sentinel file) is checked after
every round."""

from __future__ import annotations

import contextlib
import os
import pathlib
import random
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.plans import apply
from cleveragents.acp.facade.domain.plans.paths import ResourceRoot
from cleveragents.acp.facade.domain.plans.staging import StagedArtifact
from cleveragents.acp.v1 import plan_pb2
from tests.facade.plans.helpers import add_action, add_project, run, use

ROUNDS = 300
ROUND_SECONDS = 3.0
SENTINEL = b"outside: never touched\n"


@pytest.fixture
def world(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    root, outside = tmp_path / "repo", tmp_path / "outside"
    (root / "zz").mkdir(parents=True)
    outside.mkdir()
    (outside / "f.txt").write_bytes(SENTINEL)
    return root, outside


def _outside_intact(outside: pathlib.Path) -> None:
    assert sorted(p.name for p in outside.iterdir()) == ["f.txt"]
    assert (outside / "f.txt").read_bytes() == SENTINEL


@contextlib.contextmanager
def swapping(
    folder: pathlib.Path,
    outside: pathlib.Path,
    *,
    linked: float = 0.002,
    real: float = 0.0005,
    seed: int = 17,
) -> Iterator[Callable[[], int]]:
    """Swap ``folder`` for a symlink to ``outside`` and back until the block ends, staying
    a random time in each state (``linked`` and ``real`` seconds on average; by default
    mostly a symlink, the dangerous state); yields how many swaps were made so far."""
    stop = threading.Event()
    aside = folder.with_name(folder.name + ".real")
    swaps = 0

    def swap() -> None:
        nonlocal swaps
        chance = random.Random(seed)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                os.rename(folder, aside)
                os.symlink(outside, folder)
                swaps += 1
                time.sleep(chance.uniform(0, 2 * linked))
                os.unlink(folder)
                os.rename(aside, folder)
                time.sleep(chance.uniform(0, 2 * real))

    thread = threading.Thread(target=swap, daemon=True)
    thread.start()
    try:
        yield lambda: swaps
    finally:
        stop.set()
        thread.join(10)
        assert not thread.is_alive()
        if folder.is_symlink():
            folder.unlink()
        if aside.exists() and not folder.exists():
            os.rename(aside, folder)


def _artifacts(count: int) -> list[StagedArtifact]:
    paths = [f"a/{i}.txt" for i in range(count)] + ["zz/f.txt"]
    return [
        StagedArtifact("repo", p, plan_pb2.ARTIFACT_OP_CREATE, b"plan wrote this\n", None, "s") for p in paths
    ]


def test_apply_and_restore_race_a_symlink_swap(world: tuple[pathlib.Path, pathlib.Path]) -> None:
    root, outside = world
    resources = {"repo": ResourceRoot("repo", root)}
    deadline = time.monotonic() + ROUND_SECONDS
    rounds = 0
    with swapping(root / "zz", outside):
        while rounds < ROUNDS and time.monotonic() < deadline:
            rounds += 1
            try:
                writes = apply.prepare(_artifacts(3), resources)
            except ACPError:
                continue
            with contextlib.suppress(OSError):
                apply.write_all(writes)
            apply.restore_all([w.entry for w in writes], apply.anchors_of(writes))
            _outside_intact(outside)
    _outside_intact(outside)
    assert rounds > 10


def test_forty_files_then_zz_f_txt_never_lands_outside(world: tuple[pathlib.Path, pathlib.Path]) -> None:
    """The finding's reproduction: 40 files, then zz/f.txt, zz swapped while they are written."""
    root, outside = world
    resources = {"repo": ResourceRoot("repo", root)}
    for _ in range(10):
        writes = apply.prepare(_artifacts(40), resources)
        with swapping(root / "zz", outside):
            with contextlib.suppress(OSError):
                apply.write_all(writes)
            _outside_intact(outside)
            apply.restore_all([w.entry for w in writes], apply.anchors_of(writes))
        _outside_intact(outside)
        assert not any((root / "a").glob("*.txt"))


def test_recovery_restore_never_deletes_outside(world: tuple[pathlib.Path, pathlib.Path]) -> None:
    """Start-up recovery calls ``restore`` on a half-applied checkpoint: zz is now a link."""
    root, outside = world
    resources = {"repo": ResourceRoot("repo", root)}
    writes = apply.prepare(_artifacts(2), resources)
    apply.write_all(writes)
    os.rename(root / "zz", root / "zz.moved")
    (root / "zz").symlink_to(outside)
    outcome = apply.restore_all([w.entry for w in writes], apply.anchors_of(writes))
    _outside_intact(outside)
    # The plan's file is still in zz.moved: not restored, and said so (it was listed restored).
    assert outcome.skipped == ["zz/f.txt"]
    assert "zz/f.txt" not in outcome.restored
    assert (root / "zz.moved" / "f.txt").exists()


async def test_rollback_with_force_never_deletes_through_a_symlink(
    client: ACPClient, tmp_path: pathlib.Path
) -> None:
    """The finding's reproduction: apply made vv/victim.txt, vv became a link to an outside
    folder holding a victim.txt, rollback force=true."""
    root, outside = tmp_path / "repo", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "victim.txt").write_bytes(SENTINEL)
    await add_project(client, root)
    await add_action(
        client, steps=[{"tool": "fs.write", "args": {"path": "vv/victim.txt", "content": "plan"}}]
    )
    plan = await run(client, (await use(client, {})).meta.id)
    await client.call("plan.apply", plan_id=plan.meta.id)
    assert (root / "vv" / "victim.txt").read_text() == "plan"
    (root / "vv" / "victim.txt").unlink()
    (root / "vv").rmdir()
    (root / "vv").symlink_to(outside)
    with pytest.raises(ACPError) as info:
        await client.call("plan.rollback", plan_id=plan.meta.id)
    assert info.value.code == "INVALID_STATE"
    await client.call("plan.rollback", plan_id=plan.meta.id, force=True)
    assert (outside / "victim.txt").read_bytes() == SENTINEL
    assert (root / "vv").is_symlink()


async def test_rollback_with_force_races_a_symlink_swap(client: ACPClient, tmp_path: pathlib.Path) -> None:
    root, outside = tmp_path / "repo", tmp_path / "outside"
    (root / "zz").mkdir(parents=True)
    outside.mkdir()
    (outside / "f.txt").write_bytes(SENTINEL)
    await add_project(client, root)
    steps = [
        {"tool": "fs.write", "args": {"path": f"zz/{name}", "content": "plan"}} for name in ("f.txt", "g.txt")
    ]
    await add_action(client, steps=steps)
    for _ in range(10):
        plan = await run(client, (await use(client, {})).meta.id)
        await client.call("plan.apply", plan_id=plan.meta.id)
        with swapping(root / "zz", outside):
            await client.call("plan.rollback", plan_id=plan.meta.id, force=True)
        _outside_intact(outside)
        for name in ("f.txt", "g.txt"):
            with contextlib.suppress(FileNotFoundError):
                (root / "zz" / name).unlink()


async def test_apply_through_the_facade_races_a_symlink_swap(
    client: ACPClient, tmp_path: pathlib.Path
) -> None:
    root, outside = tmp_path / "repo", tmp_path / "outside"
    (root / "zz").mkdir(parents=True)
    outside.mkdir()
    (outside / "f.txt").write_bytes(SENTINEL)
    await add_project(client, root)
    steps = [{"tool": "fs.write", "args": {"path": f"a/{i}.txt", "content": "x"}} for i in range(40)]
    steps.append({"tool": "fs.write", "args": {"path": "zz/f.txt", "content": "plan wrote this"}})
    await add_action(client, steps=steps)
    for _ in range(3):
        plan = await run(client, (await use(client, {})).meta.id)
        with swapping(root / "zz", outside), contextlib.suppress(ACPError):
            await client.call("plan.apply", plan_id=plan.meta.id)
        _outside_intact(outside)
        status = await client.call("plan.status", plan_id=plan.meta.id)
        assert isinstance(status, plan_pb2.GetPlanStatusResponse)
        if (
            status.plan.state == plan_pb2.PLAN_STATE_SUCCEEDED
            and status.plan.phase == plan_pb2.PLAN_PHASE_APPLY
        ):
            await client.call("plan.rollback", plan_id=plan.meta.id, force=True)
        _outside_intact(outside)
