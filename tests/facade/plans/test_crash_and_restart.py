"""A server killed with SIGKILL during apply leaves the project with all of a plan's
changes or none, and its plan saying which; plans left running are failed as
``interrupted`` when the server starts again."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import plan_pb2
from tests.facade.plans.helpers import (
    PY,
    add_action,
    add_command_tool,
    add_profile,
    add_project,
    eventually,
    plan_events,
    snapshot,
    status,
    use,
    write_tree,
)
from tests.server_process import Children

REPO = pathlib.Path(__file__).resolve().parents[3]
TIMEOUT = 30


def start_child(children: Children, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return children.popen(
        [sys.executable, "-m", "tests.facade.plans.plan_child", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        text=True,
        env={**os.environ, **(env or {})},
    )


def read_line(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    line = child.stdout.readline().strip()
    if not line:
        child.kill()
        _, err = child.communicate(timeout=TIMEOUT)
        pytest.fail(f"the child printed nothing; stderr:\n{err}")
    return line


def wait_for_file(path: pathlib.Path, child: subprocess.Popen[str], *, written: bool = False) -> None:
    """Until ``path`` exists (and, when ``written``, holds something)."""
    deadline = time.monotonic() + TIMEOUT
    while not path.exists() or (written and not path.read_text()):
        assert child.poll() is None, "the child exited early"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def kill(child: subprocess.Popen[str]) -> None:
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=TIMEOUT)
    assert child.stdout is not None
    assert child.stderr is not None
    child.stdout.close()
    child.stderr.close()


@pytest.mark.parametrize("files_written", [1, 3])
async def test_sigkill_during_apply_is_all_or_nothing(
    tmp_path: pathlib.Path, files_written: int, children: Children
) -> None:
    folder = tmp_path / "repo"
    write_tree(folder)
    before = snapshot(folder)
    db = tmp_path / "acp.db"
    pause = tmp_path / "pause"
    pause.write_text(str(files_written))
    child = start_child(
        children, "apply", str(db), str(folder), env={"ACP_TEST_APPLY_PAUSE_FILE": str(pause)}
    )
    plan_id = read_line(child)
    wait_for_file(tmp_path / f"pause.{files_written}", child)
    assert snapshot(folder) != before, "the kill must land after apply wrote files"
    kill(child)

    facade = open_facade(db)
    client = ACPClient(LocalTransport(facade, owns_facade=True))
    try:
        plan = await status(client, plan_id)
        assert (plan.phase, plan.state) == (plan_pb2.PLAN_PHASE_APPLY, plan_pb2.PLAN_STATE_FAILED)
        assert plan.last_error.code == "interrupted"
        assert snapshot(folder) == before, "none of the plan's changes stay"
        events = await plan_events(client, plan_id)
        assert events[-1].plan_state_changed.reason == "interrupted"
        # Nothing was applied, so apply may run again, and completes.
        pause.unlink()
        applied = await client.call("plan.apply", plan_id=plan_id)
        assert isinstance(applied, plan_pb2.ApplyPlanResponse)
        assert applied.plan.state == plan_pb2.PLAN_STATE_SUCCEEDED
        assert (folder / "docs/guide.md").read_text() == "# The guide\n"
        assert not (folder / "obsolete.txt").exists()
        await client.call("plan.rollback", plan_id=plan_id)
        assert snapshot(folder) == before
    finally:
        await client.close()


async def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_a_plan_running_when_the_server_dies_is_failed_as_interrupted(
    tmp_path: pathlib.Path, children: Children
) -> None:
    folder = tmp_path / "repo"
    write_tree(folder)
    db = tmp_path / "acp.db"
    pid_file = tmp_path / "pid"
    child = start_child(children, "running", str(db), str(folder), str(pid_file))
    plan_id = read_line(child)
    wait_for_file(pid_file, child, written=True)
    # The command runs in a process group of its own: the fixture kills it if the test
    # fails before the server's death ends it.
    children.group(int(pid_file.read_text()))
    # Another process opening the database leaves a live server's plan alone.
    other = ACPClient(LocalTransport(open_facade(db), owns_facade=True))
    try:
        plan = await status(other, plan_id)
        assert (plan.phase, plan.state) == (plan_pb2.PLAN_PHASE_EXECUTE, plan_pb2.PLAN_STATE_RUNNING)
    finally:
        await other.close()
    kill(child)
    # Its supervisor kills the command's group when the server that started it dies.
    command = int(pid_file.read_text())
    await eventually(lambda: gone(command))

    client = ACPClient(LocalTransport(open_facade(db), owns_facade=True))
    try:
        plan = await status(client, plan_id)
        assert (plan.phase, plan.state) == (plan_pb2.PLAN_PHASE_EXECUTE, plan_pb2.PLAN_STATE_FAILED)
        assert plan.last_error.code == "interrupted"
        tree = await client.call("plan.tree", plan_id=plan_id)
        assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
        assert tree.steps[0].state == plan_pb2.PLAN_STATE_FAILED
        assert tree.steps[0].error.code == "interrupted"
        errors = [e for e in await plan_events(client, plan_id) if e.type == "plan.error"]
        assert [e.plan_error.error.code for e in errors] == ["interrupted"]
    finally:
        await client.close()


async def test_closing_the_server_interrupts_running_plans(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "repo"
    write_tree(folder)
    db = tmp_path / "acp.db"
    pid_file = tmp_path / "pid"
    client = ACPClient(LocalTransport(open_facade(db), owns_facade=True))
    script = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
    await add_project(client, folder)
    await add_command_tool(client, "slow", [PY, "-c", script, str(pid_file)])
    await add_profile(client, "slow", allowed_tools=["slow"])
    await add_action(client, steps=[{"tool": "slow", "args": {}}], profile="slow")
    plan_id = (await use(client, {})).meta.id
    await client.call("plan.execute", plan_id=plan_id)

    async def started() -> bool:
        return pid_file.exists() and bool(pid_file.read_text())

    await eventually(started)
    await client.close()
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)
    reopened = ACPClient(LocalTransport(open_facade(db), owns_facade=True))
    try:
        plan = await status(reopened, plan_id)
        assert (plan.state, plan.last_error.code) == (plan_pb2.PLAN_STATE_FAILED, "interrupted")
        tree = await reopened.call("plan.tree", plan_id=plan_id)
        assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
        assert tree.steps[0].error.code == "interrupted"
    finally:
        await reopened.close()
