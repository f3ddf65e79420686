"""Issue 31 failures 1 and 2: file operations start from the operator's resource root.

A tenant owns everything below its root: it may make folders and symlinks there, and
swap a folder ABOVE its resource (still inside its root) for a symlink to a folder
outside, which it fills with a copy of the resource's layout. Apply, rollback with
force, start-up recovery, plan reads (diff) and context reads by a reader must never
touch or return anything outside. Each race is driven at an exact point (apply's pause
between files, a wrapper right after the context lookup), and apply also under a
bounded randomized swapper. The server here runs as root when the suite does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pathlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade import auth
from cleveragents.acp.facade.domain.access.policy import Policy
from cleveragents.acp.facade.domain.context import files as context_files
from cleveragents.acp.facade.domain.plans import apply, paths, staging
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import context_pb2, plan_pb2
from tests.facade.plans.helpers import add_action, add_project, eventually, run, status, write_tree
from tests.facade.plans.test_crash_and_restart import kill, read_line, start_child, wait_for_file
from tests.security.test_symlink_races import swapping
from tests.server_process import Children

NS = "team-a"
SECRET = b"OUTSIDE-SECRET of another tenant\n"
ROUNDS = 200
ROUND_SECONDS = 3.0


@dataclass
class World:
    roots: pathlib.Path  # the operator's --resource-root ({namespace} below it)
    work: pathlib.Path  # a folder above the resource, inside the tenant's root
    repo: pathlib.Path  # the resource folder
    outside: pathlib.Path  # where the tenant's symlink points: a copy of work's layout

    def outside_files(self) -> dict[str, bytes]:
        return {
            p.relative_to(self.outside).as_posix(): p.read_bytes()
            for p in sorted(self.outside.rglob("*"))
            if p.is_file()
        }

    def swap(self) -> None:
        """``work`` becomes a symlink to ``outside`` (the real folder kept beside it)."""
        os.rename(self.work, self.work.with_name("work.real"))
        self.work.symlink_to(self.outside)


def _mirror(folder: pathlib.Path, files: dict[str, bytes]) -> None:
    for path, content in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_bytes(content)


@pytest.fixture
def world(tmp_path: pathlib.Path) -> World:
    roots = tmp_path / "roots"
    work = roots / NS / "work"
    repo = work / "repo"
    _mirror(repo, {"keep.txt": b"inside\n", "docs/a.md": b"inside text\n", "zz/.keep": b""})
    outside = tmp_path / "outside"
    _mirror(
        outside,
        {
            "repo/keep.txt": SECRET,
            "repo/docs/a.md": SECRET,
            "repo/vv/victim.txt": SECRET,
            "repo/zz/f.txt": SECRET,
            "docs/a.md": SECRET,
        },
    )
    return World(roots, work, repo, outside)


@dataclass
class Server:
    admin: ACPClient
    reader: ACPClient


@contextlib.asynccontextmanager
async def serving(tmp_path: pathlib.Path, policy: Policy, name: str = "first") -> AsyncIterator[Server]:
    """A facade with tokens (an admin and a reader of the tenant's namespace)."""
    tokens = tmp_path / f"tokens-{name}.toml"
    admin = auth.create_token(tokens, "admin", [NS], role="admin")
    reader = auth.create_token(tokens, "reader", [NS], role="reader")
    facade = open_facade(tmp_path / "acp.db", authenticator=auth.TokenAuthenticator(tokens), policy=policy)
    clients = Server(
        ACPClient(LocalTransport(facade), token=admin), ACPClient(LocalTransport(facade), token=reader)
    )
    try:
        yield clients
    finally:
        await clients.admin.close()
        await clients.reader.close()
        await facade.close()


def _policy(world: World) -> Policy:
    return Policy.server([f"{world.roots}/{{namespace}}"])


async def _plan(client: ACPClient, world: World, steps: list[dict[str, Any]]) -> str:
    await add_project(client, world.repo, namespace=NS)
    await add_action(client, steps=steps, namespace=NS)
    used = await client.call("plan.use", namespace=NS, action="act", project="proj", inputs={})
    assert isinstance(used, plan_pb2.UsePlanResponse)
    plan = await run(client, used.plan.meta.id)
    assert plan.state == plan_pb2.PLAN_STATE_SUCCEEDED, plan.last_error
    return plan.meta.id


def _writes(count: int) -> list[dict[str, Any]]:
    steps = [{"tool": "fs.write", "args": {"path": f"a/{i}.txt", "content": "plan"}} for i in range(count)]
    steps.append({"tool": "fs.write", "args": {"path": "zz/f.txt", "content": "plan wrote this"}})
    return steps


# apply ----------------------------------------------------------------------------------


async def test_apply_paused_between_files_while_a_parent_becomes_a_symlink(
    tmp_path: pathlib.Path, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finding: 38 of 40 files written outside and apply answered OK. Here apply
    pauses after its first file; the folder above the resource is swapped; it resumes."""
    before = world.outside_files()
    pause = tmp_path / "pause"
    pause.write_text("1")
    monkeypatch.setenv(apply.PAUSE_ENV, str(pause))
    async with serving(tmp_path, _policy(world)) as server:
        plan_id = await _plan(server.admin, world, _writes(5))
        task = asyncio.ensure_future(server.admin.call("plan.apply", plan_id=plan_id))

        async def paused() -> bool:
            return (tmp_path / "pause.1").exists()

        await eventually(paused)
        world.swap()
        pause.write_text("go")
        with pytest.raises(ACPError) as info:
            await task
        assert world.outside_files() == before, "apply wrote outside the tenant's resource"
        assert info.value.code == "INVALID_STATE"
        assert info.value.details["refinement"] == "PATH_CROSSES_SYMLINK"
        plan = await status(server.admin, plan_id)
        assert plan.state == plan_pb2.PLAN_STATE_FAILED


async def test_apply_races_a_randomized_swap_above_the_resource(
    tmp_path: pathlib.Path, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Apply pauses after its first file (the checks are done); a thread then swaps the
    folder above the resource at random moments while the other 40 files are written."""
    before = world.outside_files()
    pause = tmp_path / "pause"
    monkeypatch.setenv(apply.PAUSE_ENV, str(pause))
    async with serving(tmp_path, _policy(world)) as server:
        await add_project(server.admin, world.repo, namespace=NS)
        await add_action(server.admin, steps=_writes(40), namespace=NS)
        for round_ in range(3):
            (tmp_path / "pause.1").unlink(missing_ok=True)
            pause.write_text("1")
            used = await server.admin.call("plan.use", namespace=NS, action="act", project="proj", inputs={})
            assert isinstance(used, plan_pb2.UsePlanResponse)
            plan = await run(server.admin, used.plan.meta.id)
            task = asyncio.ensure_future(server.admin.call("plan.apply", plan_id=plan.meta.id))

            async def paused() -> bool:
                return (tmp_path / "pause.1").exists()

            await eventually(paused)
            with swapping(world.work, world.outside, linked=0.001, real=0.002, seed=round_) as swaps:
                pause.write_text("go")
                with contextlib.suppress(ACPError):
                    await task
            assert swaps() > 0
            assert world.outside_files() == before, "apply wrote outside the tenant's resource"


# rollback -------------------------------------------------------------------------------


async def test_rollback_with_force_through_a_symlinked_parent(tmp_path: pathlib.Path, world: World) -> None:
    """The finding: rollback --force overwrote an outside file with the attacker's content
    and deleted another tenant's file."""
    async with serving(tmp_path, _policy(world)) as server:
        steps = [
            {"tool": "fs.write", "args": {"path": "vv/victim.txt", "content": "plan"}},
            {"tool": "fs.write", "args": {"path": "keep.txt", "content": "changed by the plan\n"}},
        ]
        plan_id = await _plan(server.admin, world, steps)
        await server.admin.call("plan.apply", plan_id=plan_id)
        before = world.outside_files()
        world.swap()
        await server.admin.call("plan.rollback", plan_id=plan_id, force=True)
        assert world.outside_files() == before, "rollback wrote or deleted outside"
        plan = await status(server.admin, plan_id)
        assert "vv/victim.txt" in plan.last_error.message


async def test_rollback_rechecks_the_resource_roots(tmp_path: pathlib.Path, world: World) -> None:
    """Applied while the folder was inside a root; the operator then narrowed the roots:
    rollback refuses and touches nothing."""
    async with serving(tmp_path, _policy(world)) as server:
        steps = [{"tool": "fs.write", "args": {"path": "keep.txt", "content": "changed by the plan\n"}}]
        plan_id = await _plan(server.admin, world, steps)
        await server.admin.call("plan.apply", plan_id=plan_id)
    elsewhere = tmp_path / "other-roots"
    elsewhere.mkdir()
    async with serving(tmp_path, Policy.server([str(elsewhere)]), "narrowed") as server:
        with pytest.raises(ACPError) as info:
            await server.admin.call("plan.rollback", plan_id=plan_id, force=True)
        assert info.value.code == "INVALID_STATE"
        assert "resource roots" in info.value.message
    assert (world.repo / "keep.txt").read_bytes() == b"changed by the plan\n"


# plan reads -----------------------------------------------------------------------------


async def test_plan_reads_when_a_parent_flips_right_after_the_roots_check(
    tmp_path: pathlib.Path, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``plan.diff`` and ``plan.artifacts`` check the resource roots, then read the files:
    the folder above the resource becomes a symlink exactly between the two."""
    read = staging.read_disk

    def flip_then_read(*args: Any) -> Any:
        if not world.work.is_symlink():
            world.swap()
        return read(*args)

    async with serving(tmp_path, _policy(world)) as server:
        steps = [{"tool": "fs.write", "args": {"path": "keep.txt", "content": "new\n"}}]
        plan_id = await _plan(server.admin, world, steps)
        monkeypatch.setattr(staging, "read_disk", flip_then_read)
        for client in (server.admin, server.reader):
            for operation, request in (
                ("plan.diff", {"plan_id": plan_id}),
                ("plan.artifacts", {"plan_id": plan_id, "include_content": True}),
            ):
                with contextlib.suppress(ACPError):
                    answer = await client.call(operation, request)
                    assert SECRET.decode().strip() not in str(answer), operation
                # The flip happened; undone for the next read.
                world.work.unlink()
                os.rename(world.work.with_name("work.real"), world.work)


async def test_the_prompts_file_list_when_a_parent_flips_right_after_the_roots_check(
    tmp_path: pathlib.Path, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The actor's prompt lists the project's files: the folder above the resource becomes
    a symlink between the roots check and the walk, which must list no outside name."""
    listed = paths.first_files

    def flip_then_list(*args: Any, **kwargs: Any) -> Any:
        if not world.work.is_symlink():
            world.swap()
        return listed(*args, **kwargs)

    async with serving(tmp_path, _policy(world)) as server:
        monkeypatch.setattr(paths, "first_files", flip_then_list)
        with contextlib.suppress(ACPError):
            plan_id = await _plan(server.admin, world, [])
            prompt = await server.reader.call("plan.prompt", plan_id=plan_id)
            assert "victim" not in str(prompt)
        assert world.work.is_symlink(), "the walk ran"


# context reads --------------------------------------------------------------------------


async def _context(server: Server, world: World) -> None:
    await add_project(server.admin, world.repo, namespace=NS)
    await server.admin.call(
        "context.set",
        namespace=NS,
        project="proj",
        config={"sources": [{"resource": "repo", "globs": ["**"]}]},
    )


async def _inspect(client: ACPClient) -> str | None:
    try:
        found = await client.call(
            "context.inspect", namespace=NS, project="proj", item_id="file:repo/docs/a.md"
        )
    except ACPError as exc:
        if exc.code not in ("INVALID_PARAMS", "NOT_FOUND"):
            raise
        return None
    assert isinstance(found, context_pb2.InspectContextResponse)
    return found.item.content


async def test_context_inspect_when_a_folder_flips_right_after_the_lookup(
    tmp_path: pathlib.Path, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader's inspect looks the file up, then reads it: ``docs`` becomes a symlink
    to an outside folder exactly between the two."""
    looked_up = context_files.locate
    docs = world.repo / "docs"

    def then_flip(*args: Any) -> Any:
        found = looked_up(*args)
        os.rename(docs, docs.with_name("docs.real"))
        docs.symlink_to(world.outside / "docs")
        return found

    async with serving(tmp_path, _policy(world)) as server:
        await _context(server, world)
        assert await _inspect(server.reader) == "inside text\n"
        monkeypatch.setattr(context_files, "locate", then_flip)
        content = await _inspect(server.reader)
        assert content is None or SECRET.decode() not in content


async def test_context_reads_race_a_randomized_flip(tmp_path: pathlib.Path, world: World) -> None:
    async with serving(tmp_path, _policy(world)) as server:
        await _context(server, world)
        deadline = time.monotonic() + ROUND_SECONDS
        tries = 0
        with swapping(world.repo / "docs", world.outside / "docs", linked=0.0015, real=0.0005) as swaps:
            while tries < ROUNDS and time.monotonic() < deadline:
                tries += 1
                content = await _inspect(server.reader)
                assert content is None or SECRET.decode() not in content
                simulated = await server.reader.call("context.simulate", namespace=NS, project="proj")
                assert SECRET.decode().strip() not in str(simulated)
        assert swaps() > 0
        assert tries > 10


# start-up recovery ------------------------------------------------------------------------


def _crash_mid_apply(
    tmp_path: pathlib.Path, roots: pathlib.Path, repo: pathlib.Path, children: Children
) -> str:
    """A server process (roots from $ACP_RESOURCE_ROOTS) applies a plan, pauses after its
    first file and is killed there: the plan's journal says ``applying``."""
    write_tree(repo)
    pause = tmp_path / "pause"
    pause.write_text("1")
    env = {"ACP_TEST_APPLY_PAUSE_FILE": str(pause), "ACP_RESOURCE_ROOTS": str(roots)}
    child = start_child(children, "apply", str(tmp_path / "acp.db"), str(repo), env=env)
    plan_id = read_line(child)
    wait_for_file(tmp_path / "pause.1", child)
    assert (repo / "docs/guide.md").exists(), "the kill must land after apply wrote a file"
    kill(child)
    return plan_id


async def _restart(tmp_path: pathlib.Path, roots: pathlib.Path, plan_id: str) -> plan_pb2.Plan:
    """Open the database again (start-up recovery runs) and read the plan."""
    facade = open_facade(tmp_path / "acp.db", policy=Policy.local({"ACP_RESOURCE_ROOTS": str(roots)}))
    client = ACPClient(LocalTransport(facade, owns_facade=True))
    try:
        return await status(client, plan_id)
    finally:
        await client.close()


async def test_recovery_after_a_crash_mid_apply_through_a_symlinked_parent(
    tmp_path: pathlib.Path, children: Children, caplog: pytest.LogCaptureFixture
) -> None:
    roots = tmp_path / "roots"
    work = roots / "work"
    outside = tmp_path / "outside"
    _mirror(outside, {f"repo/{p}": SECRET for p in ("docs/guide.md", "obsolete.txt", "src/app.py")})
    before = {p.relative_to(outside).as_posix(): p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    plan_id = _crash_mid_apply(tmp_path, roots, work / "repo", children)
    os.rename(work, roots / "work.real")
    work.symlink_to(outside)
    plan = await _restart(tmp_path, roots, plan_id)
    after = {p.relative_to(outside).as_posix(): p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    assert after == before, "recovery wrote or deleted outside"
    assert plan.state == plan_pb2.PLAN_STATE_FAILED
    assert any("not restored" in r.getMessage() and "docs/guide.md" in r.getMessage() for r in caplog.records)


async def test_recovery_rechecks_the_resource_roots(tmp_path: pathlib.Path, children: Children) -> None:
    """The operator restarts with roots that no longer hold the folder: it is left alone."""
    roots = tmp_path / "roots"
    repo = roots / "work" / "repo"
    plan_id = _crash_mid_apply(tmp_path, roots, repo, children)
    elsewhere = tmp_path / "other-roots"
    elsewhere.mkdir()
    await _restart(tmp_path, elsewhere, plan_id)
    assert (repo / "docs/guide.md").exists(), "recovery wrote in a folder outside the roots"
