"""Issue 17 findings 7 and 10: file names a plan may stage are bounded and plain, and
apply answers a path the file system refuses with INVALID_PARAMS, never a 500."""

from __future__ import annotations

import os
import pathlib

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.plans import apply
from cleveragents.acp.facade.domain.plans.paths import ResourceRoot
from cleveragents.acp.facade.domain.plans.staging import StagedArtifact
from cleveragents.acp.v1 import plan_pb2
from tests.conformance.harness import Run, run_everywhere
from tests.facade.plans.helpers import PY, add_action, add_command_tool, add_profile, add_project, run, use
from tests.server_process import Tokens


@pytest.fixture
async def project(client: ACPClient, tmp_path: pathlib.Path) -> pathlib.Path:
    folder = tmp_path / "repo"
    folder.mkdir()
    await add_project(client, folder)
    return folder


def _tree(folder: pathlib.Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("a\nb.txt", "control character"),
        ("a\rb.txt", "control character"),
        ("tab\there.txt", "control character"),
        ("del\x7f.txt", "control character"),
        ("invoice\u202egpj.exe", "bidi override"),
        ("two\u2028lines.txt", "line separator"),
        ("nel\x85.txt", "control character"),
        ("isolate\u2066.txt", "bidi override"),
        ("..\\..\\evil.txt", "backslash"),
        ("dir\\file.txt", "backslash"),
        ("n" * 256 + ".txt", "longer than 255 bytes"),
        ("é" * 128, "longer than 255 bytes"),
        ("/".join(["d" * 200] * 6), "longer than 1024 bytes"),
    ],
)
async def test_bad_names_are_refused_at_staging(
    client: ACPClient, project: pathlib.Path, path: str, why: str
) -> None:
    await add_action(client, steps=[{"tool": "fs.write", "args": {"path": path, "content": "x"}}])
    plan = await run(client, (await use(client, {})).meta.id)
    assert plan.state == plan_pb2.PLAN_STATE_FAILED
    tree = await client.call("plan.tree", plan_id=plan.meta.id)
    assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
    assert tree.steps[0].error.code == "INVALID_PARAMS"
    assert why in tree.steps[0].error.message
    assert _tree(project) == []
    assert not (project.parent / "evil.txt").exists()


async def test_names_at_the_bounds_are_staged_and_applied(client: ACPClient, project: pathlib.Path) -> None:
    longest = "n" * 255
    deep = "/".join(["d" * 100] * 9) + "/f.txt"
    await add_action(
        client,
        steps=[
            {"tool": "fs.write", "args": {"path": longest, "content": "a"}},
            {"tool": "fs.write", "args": {"path": deep, "content": "b"}},
            {"tool": "fs.write", "args": {"path": "ünïcödé name.txt", "content": "c"}},
        ],
    )
    plan = await run(client, (await use(client, {})).meta.id)
    assert plan.state == plan_pb2.PLAN_STATE_SUCCEEDED
    await client.call("plan.apply", plan_id=plan.meta.id)
    assert (project / longest).read_text() == "a"
    assert (project / deep).read_text() == "b"
    assert (project / "ünïcödé name.txt").read_text() == "c"


async def test_a_command_tool_cannot_stage_a_bad_name(client: ACPClient, project: pathlib.Path) -> None:
    script = "open('a\\nb.txt', 'w').write('x')"
    await add_command_tool(client, "mk", [PY, "-c", script])
    await add_profile(client, "cmds", allowed_tools=["mk"])
    await add_action(client, steps=[{"tool": "mk", "args": {}}], profile="cmds")
    plan = await run(client, (await use(client, {})).meta.id)
    assert plan.state == plan_pb2.PLAN_STATE_FAILED
    tree = await client.call("plan.tree", plan_id=plan.meta.id)
    assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
    assert tree.steps[0].error.code == "INVALID_PARAMS"
    assert "control character" in tree.steps[0].error.message
    assert _tree(project) == []


def test_apply_refuses_a_stored_name_the_file_system_cannot_hold(tmp_path: pathlib.Path) -> None:
    """A plan staged before the bounds existed: apply answers INVALID_PARAMS, not ENAMETOOLONG."""
    root = ResourceRoot("repo", tmp_path)
    artifact = StagedArtifact("repo", "n" * 300, plan_pb2.ARTIFACT_OP_CREATE, b"x", None, "s1")
    with pytest.raises(ACPError) as info:
        apply.prepare([artifact], {"repo": root})
    assert info.value.code == "INVALID_PARAMS"
    assert list(tmp_path.iterdir()) == []


async def test_apply_under_a_deep_root_never_answers_500(client: ACPClient, tmp_path: pathlib.Path) -> None:
    """Root and path together over PATH_MAX: the file is written or the apply is refused
    with INVALID_PARAMS, and the plan can still be told what went wrong."""
    folder = tmp_path
    while len(str(folder)) < 3600:
        folder = folder / ("r" * 200)
    folder.mkdir(parents=True)
    await add_project(client, folder)
    deep = "/".join(["d" * 200] * 4) + "/f.txt"
    await add_action(client, steps=[{"tool": "fs.write", "args": {"path": deep, "content": "x"}}])
    plan = await run(client, (await use(client, {})).meta.id)
    assert plan.state == plan_pb2.PLAN_STATE_SUCCEEDED
    refused: ACPError | None = None
    try:
        await client.call("plan.apply", plan_id=plan.meta.id)
    except ACPError as exc:
        refused = exc
    if refused is None:
        # Too long to name from /: read it relative to the folder.
        folder_fd = os.open(folder, os.O_RDONLY)
        try:
            fd = os.open(deep, os.O_RDONLY, dir_fd=folder_fd)
            with os.fdopen(fd, "rb") as handle:
                assert handle.read() == b"x"
        finally:
            os.close(folder_fd)
        return
    assert refused.code == "INVALID_PARAMS", refused
    status = await client.call("plan.status", plan_id=plan.meta.id)
    assert isinstance(status, plan_pb2.GetPlanStatusResponse)
    assert status.plan.last_error.code == "INVALID_PARAMS"


async def bad_names_everywhere(run_: Run) -> None:
    """The names of findings 7 and 10 through a transport: each plan fails at staging with
    INVALID_PARAMS naming why, applying it is a clear refusal (never a 500), and nothing is
    written."""
    alice = run_.client("alice")
    folder = run_.root / "repo"
    folder.mkdir()
    await add_project(alice, folder)
    for index, (path, why) in enumerate(
        [("a\nb.txt", "control character"), ("..\\..\\evil.txt", "backslash"), ("n" * 256, "255 bytes")]
    ):
        steps = [{"tool": "fs.write", "args": {"path": path, "content": "x"}}]
        await add_action(alice, name=f"bad{index}", steps=steps)
        plan = await run(alice, (await use(alice, {}, action=f"bad{index}")).meta.id)
        assert plan.state == plan_pb2.PLAN_STATE_FAILED
        tree = await alice.call("plan.tree", plan_id=plan.meta.id)
        assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
        assert tree.steps[0].error.code == "INVALID_PARAMS"
        assert why in tree.steps[0].error.message
        await run_.fails(alice.call("plan.apply", plan_id=plan.meta.id), "INVALID_STATE")
    assert _tree(folder) == []


async def test_bad_names_are_refused_alike_on_every_transport(tmp_path: pathlib.Path) -> None:
    await run_everywhere(bad_names_everywhere, tmp_path, Tokens.create(tmp_path))
