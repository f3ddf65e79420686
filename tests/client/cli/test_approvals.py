"""Approvals from the CLI (ACP 1.3): ``plan execute --wait`` ends with the pending question on
stderr and how to answer it (exit 13); ``approval list``, ``approval show`` and ``approval
answer`` then resume the plan; a second answer is INVALID_STATE's exit code with who decided."""

from __future__ import annotations

import json
import pathlib

from tests.client.cli.conftest import Cli


def seed(cli: Cli, folder: pathlib.Path) -> str:
    folder.mkdir()
    (folder / "README.md").write_text("# Demo\n")
    cli("resource", "add", "repo", "--spec", json.dumps({"type": "directory", "path": str(folder)}))
    cli("project", "add", "proj", "--spec", '{"resources": ["repo"]}')
    cli("automation-profile", "add", "gated", "--spec", '{"approval": {"ask": ["fs.write"]}}')
    steps = [{"id": "write", "tool": "fs.write", "args": {"path": "NOTES.md", "content": "hi\n"}}]
    spec = {"actor": "scripted", "steps": steps, "automation_profile": "gated"}
    cli("action", "add", "act", "--spec", json.dumps(spec))
    return cli("plan", "use", "act", "proj", "--value", "plan.meta.id").out.strip()


def test_execute_wait_prints_the_question_and_answer_resumes_the_plan(
    local_cli: Cli, tmp_path: pathlib.Path
) -> None:
    cli = local_cli
    plan_id = seed(cli, tmp_path / "repo")
    waited = cli("plan", "execute", plan_id, "--wait", expect=13)
    assert f"agents: plan {plan_id} awaits approval" in waited.err, waited
    assert "step write: fs.write {" in waited.err, waited
    assert '"path": "NOTES.md"' in waited.err, waited
    assert "--answer allow_once" in waited.err, waited
    listed = json.loads(cli("approval", "list", "--plan-id", plan_id, "--state", "pending", "--json").out)
    [approval] = listed["approvals"]
    shown = json.loads(cli("approval", "show", approval["id"], "--json").out)
    assert shown["approval"]["digest"] == approval["digest"]
    answered = cli("approval", "answer", approval["id"], "--answer", "allow_once", "--reason", "ok", "--json")
    assert json.loads(answered.out)["approval"]["state"] == "APPROVAL_STATE_ALLOWED"
    # Local mode waited for the resumed run before it exited.
    status = json.loads(cli("plan", "status", plan_id, "--json").out)
    assert status["plan"]["state"] == "PLAN_STATE_SUCCEEDED", status
    again = cli("approval", "answer", approval["id"], "--answer", "reject_once", expect=8)
    assert "already decided: allow_once by local" in again.err, again
