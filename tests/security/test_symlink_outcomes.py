"""What a plan reports when a folder under it became a symlink (issue 17, findings 3 and 4,
the reports half): a rollback that leaves a path alone says so (``skipped_paths``, ACP 1.2,
and the plan's last_error) instead of reporting success, and an apply that meets a symlink
midway is INVALID_STATE (``PATH_CROSSES_SYMLINK``, the path named), undone, the plan failed,
not INTERNAL_ERROR. On every transport."""

from __future__ import annotations

import asyncio
import pathlib
import threading

import pytest

from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.plans import apply
from cleveragents.acp.v1 import plan_pb2
from tests.conformance.backends import KINDS, open_backend
from tests.facade.plans.helpers import add_action, add_project, run, use
from tests.security.test_bounds_limits import in_own_loop
from tests.server_process import Tokens

SENTINEL = b"outside: never touched\n"


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Tokens:
    return Tokens.create(tmp_path_factory.mktemp("symlink-tokens"))


@pytest.mark.parametrize("kind", KINDS)
def test_rollback_reports_the_paths_it_left(kind: str, tmp_path: pathlib.Path, tokens: Tokens) -> None:
    """apply made vv/victim.txt; vv became a link to an outside folder; rollback force=true
    restored the rest, left vv/victim.txt alone, and used to answer as if it had all."""

    async def body() -> None:
        async with open_backend(kind, tmp_path, tokens) as backend:
            root, outside = backend.root / "repo", backend.root / "outside"
            root.mkdir()
            outside.mkdir()
            (outside / "victim.txt").write_bytes(SENTINEL)
            alice = backend.client("alice")
            await add_project(alice, root)
            steps = [
                {"tool": "fs.write", "args": {"path": "vv/victim.txt", "content": "plan"}},
                {"tool": "fs.write", "args": {"path": "kept.txt", "content": "plan"}},
            ]
            await add_action(alice, steps=steps)
            plan = await run(alice, (await use(alice, {})).meta.id)
            await alice.call("plan.apply", plan_id=plan.meta.id)
            (root / "vv").rename(root / "vv.moved")
            (root / "vv").symlink_to(outside)
            answer = await alice.call("plan.rollback", plan_id=plan.meta.id, force=True)
            assert isinstance(answer, plan_pb2.RollbackPlanResponse)
            assert list(answer.restored_paths) == ["kept.txt"]
            assert list(answer.skipped_paths) == ["vv/victim.txt"]
            assert answer.plan.state == plan_pb2.PLAN_STATE_ROLLED_BACK
            assert answer.plan.last_error.code == "INVALID_STATE"
            assert "vv/victim.txt" in answer.plan.last_error.message
            assert not (root / "kept.txt").exists()
            assert (outside / "victim.txt").read_bytes() == SENTINEL
            assert (root / "vv.moved" / "victim.txt").read_text() == "plan"

    in_own_loop(body)


@pytest.mark.parametrize("kind", KINDS)
def test_a_symlink_met_mid_apply_is_invalid_state(
    kind: str, tmp_path: pathlib.Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first file is written, then zz becomes a link to an outside folder before
    zz/f.txt: INVALID_STATE naming zz/f.txt (it was INTERNAL_ERROR), the first file undone,
    the plan failed in apply with that error, nothing outside touched."""
    marker = tmp_path / "pause"
    marker.write_text("1")
    monkeypatch.setenv(apply.PAUSE_ENV, str(marker))

    async def body() -> None:
        async with open_backend(kind, tmp_path / "backend", tokens) as backend:
            root, outside = backend.root / "repo", backend.root / "outside"
            (root / "zz").mkdir(parents=True)
            outside.mkdir()
            (outside / "f.txt").write_bytes(SENTINEL)
            alice = backend.client("alice")
            await add_project(alice, root)
            steps = [
                {"tool": "fs.write", "args": {"path": "a.txt", "content": "plan"}},
                {"tool": "fs.write", "args": {"path": "zz/f.txt", "content": "plan"}},
            ]
            await add_action(alice, steps=steps)
            plan = await run(alice, (await use(alice, {})).meta.id)
            paused = pathlib.Path(f"{marker}.1")

            def swap() -> None:
                # Bounded: the first write lands within seconds, or the test fails below.
                for _ in range(1000):
                    if paused.exists():
                        (root / "zz").rename(root / "zz.moved")
                        (root / "zz").symlink_to(outside)
                        break
                    threading.Event().wait(0.01)
                marker.write_text("0")

            swapper = threading.Thread(target=swap)
            swapper.start()
            try:
                with pytest.raises(ACPError) as info:
                    await alice.call("plan.apply", plan_id=plan.meta.id)
            finally:
                await asyncio.to_thread(swapper.join, 30)
            assert await asyncio.to_thread(paused.exists)
            err = info.value
            assert err.code == "INVALID_STATE", err
            assert err.details["refinement"] == "PATH_CROSSES_SYMLINK"
            assert err.details["path"] == "zz/f.txt"
            assert not (root / "a.txt").exists()
            assert (outside / "f.txt").read_bytes() == SENTINEL
            status = await alice.call("plan.status", plan_id=plan.meta.id)
            assert isinstance(status, plan_pb2.GetPlanStatusResponse)
            assert (status.plan.phase, status.plan.state) == (
                plan_pb2.PLAN_PHASE_APPLY,
                plan_pb2.PLAN_STATE_FAILED,
            )
            assert status.plan.last_error.code == "INVALID_STATE"
            assert "zz/f.txt" in status.plan.last_error.message

    in_own_loop(body)
