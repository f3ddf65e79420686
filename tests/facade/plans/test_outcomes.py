"""Plans that do not simply succeed: failing validations, violated invariants, budgets,
cancel during a slow command, corrections, unsafe paths, command tools."""

from __future__ import annotations

import os
import pathlib
import threading
import time
from typing import Any

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.plans import invariants
from cleveragents.acp.facade.domain.plans import steps as plan_steps
from cleveragents.acp.v1 import plan_pb2
from tests.facade.plans.helpers import (
    PY,
    add_action,
    add_command_tool,
    add_profile,
    add_project,
    eventually,
    plan_events,
    run,
    snapshot,
    status,
    use,
    wait_for,
    write_tree,
)


@pytest.fixture
async def project(client: ACPClient, tmp_path: pathlib.Path) -> pathlib.Path:
    folder = tmp_path / "repo"
    write_tree(folder)
    await add_project(client, folder)
    return folder


async def test_a_failing_validation_fails_execute_with_its_messages(
    client: ACPClient, project: pathlib.Path
) -> None:
    await client.call(
        "validation.add",
        name="heading",
        spec={"paths": ["docs/*.md"], "regex": {"pattern": "^# ", "must_match": True}},
    )
    await client.call(
        "validation.add", name="no-old", spec={"regex": {"pattern": "guide", "must_match": False}}
    )
    await client.call(
        "validation.add",
        name="json",
        spec={"paths": ["**/*.json"], "json_schema": {"schema": {"type": "object"}}},
    )
    await add_action(client, validations=["heading", "no-old", "json"])
    before = snapshot(project)
    plan = await run(client, (await use(client)).meta.id)
    assert (plan.phase, plan.state) == (plan_pb2.PLAN_PHASE_EXECUTE, plan_pb2.PLAN_STATE_FAILED)
    assert plan.last_error.code == "validation_failed"
    assert "no-old: docs/guide.md:1: matches pattern 'guide'" in plan.last_error.message
    assert "heading" not in plan.last_error.message
    results = [
        e.validation_completed
        for e in await plan_events(client, plan.meta.id)
        if e.type == "validation.completed"
    ]
    assert [(r.validation, r.passed) for r in results] == [
        ("heading", True),
        ("no-old", False),
        ("json", True),
    ]
    with pytest.raises(ACPError) as info:
        await client.call("plan.apply", plan_id=plan.meta.id)
    assert info.value.code == "INVALID_STATE"
    assert snapshot(project) == before


async def test_json_schema_and_command_validations(client: ACPClient, project: pathlib.Path) -> None:
    await client.call(
        "validation.add",
        name="shape",
        spec={"paths": ["*.json"], "json_schema": {"schema": {"type": "object", "required": ["name"]}}},
    )
    await client.call(
        "validation.add",
        name="has-config",
        spec={
            "command": {
                "argv": [PY, "-c", "import os, sys; sys.exit(0 if os.path.exists('config.json') else 3)"]
            }
        },
    )
    # A command validation runs a process: only when the profile lists it.
    await add_profile(client, "checks", allowed_validations=["has-config"])
    await add_action(
        client,
        steps=[{"tool": "fs.write", "args": {"path": "config.json", "content": "{{body}}"}}],
        validations=["shape", "has-config"],
        profile="checks",
    )
    good = await run(client, (await use(client, {"body": '{"name": "x"}'})).meta.id)
    assert good.state == plan_pb2.PLAN_STATE_SUCCEEDED
    bad = await run(client, (await use(client, {"body": '{"other": 1}'})).meta.id)
    assert bad.state == plan_pb2.PLAN_STATE_FAILED
    assert "shape: config.json: $: 'name' is a required property" in bad.last_error.message
    broken = await run(client, (await use(client, {"body": "not json"})).meta.id)
    assert "config.json: not JSON" in broken.last_error.message


async def test_invariants_are_matched_off_the_event_loop(
    client: ACPClient, project: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forbid_regex over every staged file's content runs on a worker thread, so a big
    plan's apply check holds no other call."""
    threads: list[bool] = []
    real = invariants.violations

    def watched(*args: Any) -> list[str]:
        threads.append(threading.current_thread() is threading.main_thread())
        return real(*args)

    monkeypatch.setattr(invariants, "violations", watched)
    await client.call("invariant.add", name="no-x", spec={"forbid_regex": {"pattern": "x{3}"}})
    await add_action(client, invariants=["no-x"])
    plan = await run(client, (await use(client)).meta.id)
    applied = await client.call("plan.apply", plan_id=plan.meta.id)
    assert isinstance(applied, plan_pb2.ApplyPlanResponse)
    assert threads == [False]


async def test_a_violated_invariant_refuses_apply_listing_each_violation(
    client: ACPClient, project: pathlib.Path
) -> None:
    await client.call("invariant.add", name="only-src", spec={"paths_within": {"globs": ["src/**"]}})
    await client.call("invariant.add", name="small", spec={"max_files_changed": {"limit": 2}})
    await client.call(
        "invariant.add", name="no-secrets", spec={"forbid_regex": {"pattern": "guide", "paths": ["docs/*"]}}
    )
    await add_action(client, invariants=["only-src", "small", "no-secrets"])
    before = snapshot(project)
    plan = await run(client, (await use(client)).meta.id)
    assert plan.state == plan_pb2.PLAN_STATE_SUCCEEDED
    with pytest.raises(ACPError) as info:
        await client.call("plan.apply", plan_id=plan.meta.id)
    assert info.value.code == "INVALID_STATE"
    assert info.value.details["violations"] == [
        "only-src: docs/guide.md is outside src/**",
        "only-src: obsolete.txt is outside src/**",
        "small: 3 files changed, at most 2 allowed",
        "no-secrets: docs/guide.md:1 matches forbidden pattern 'guide'",
    ]
    assert snapshot(project) == before
    after = await status(client, plan.meta.id)
    assert (after.phase, after.state) == (plan_pb2.PLAN_PHASE_EXECUTE, plan_pb2.PLAN_STATE_SUCCEEDED)
    assert after.last_error.code == "INVALID_STATE"
    errors = [e for e in await plan_events(client, plan.meta.id) if e.type == "plan.error"]
    assert len(errors) == 1
    assert errors[0].plan_error.error.message.startswith("apply refused: 4 invariant violation(s)")


async def test_crossing_the_cost_budget_stops_the_plan(client: ACPClient, project: pathlib.Path) -> None:
    await add_command_tool(client, "touch", [PY, "-c", "open('{{name}}', 'w').close()"], cost=1.0)
    await add_profile(client, "tight", allowed_tools=["touch"], cost_budget=1.5)
    await add_action(
        client,
        steps=[{"tool": "touch", "args": {"name": "a"}}, {"tool": "touch", "args": {"name": "b"}}],
        profile="tight",
    )
    plan = await run(client, (await use(client, {})).meta.id)
    assert (plan.phase, plan.state) == (plan_pb2.PLAN_PHASE_EXECUTE, plan_pb2.PLAN_STATE_FAILED)
    assert plan.last_error.code == "BUDGET_EXCEEDED"
    assert (plan.cost.spent, plan.cost.budget) == (1.0, 1.5)
    assert (plan.progress.done, plan.progress.total) == (1, 2)
    events = await plan_events(client, plan.meta.id)
    assert [e.plan_error.error.code for e in events if e.type == "plan.error"] == ["BUDGET_EXCEEDED"]
    assert [e.tool_completed.step_id for e in events if e.type == "tool.completed"] == ["step-1"]


async def test_max_steps_and_actor_usage_count_against_the_budget(
    client: ACPClient, project: pathlib.Path
) -> None:
    await add_profile(client, "two", max_steps=2)
    await add_action(client, profile="two")
    plan = await run(client, (await use(client)).meta.id)
    assert plan.last_error.code == "BUDGET_EXCEEDED"
    assert "allows 2" in plan.last_error.message
    await client.call("actor.add", name="pricey", spec={"provider": "scripted", "cost_per_1k_tokens": 1000})
    await add_profile(client, "cheap", cost_budget=5)
    await add_action(client, name="costly", steps=[], actor="pricey", profile="cheap")
    plan_id = (await use(client, {}, action="costly")).meta.id
    plan = await run(client, plan_id)
    assert (plan.phase, plan.state) == (plan_pb2.PLAN_PHASE_STRATEGIZE, plan_pb2.PLAN_STATE_FAILED)
    assert plan.last_error.code == "BUDGET_EXCEEDED"
    assert plan.cost.spent > 5


async def test_a_plan_without_max_steps_stops_at_the_default(
    client: ACPClient, project: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default (1,000) is lowered so the test runs three steps, not a thousand and one.
    monkeypatch.setattr(plan_steps, "DEFAULT_MAX_STEPS", 2)
    await add_action(client)
    plan = await run(client, (await use(client)).meta.id)
    assert plan.last_error.code == "BUDGET_EXCEEDED"
    assert "would be step 3; the default is 2" in plan.last_error.message
    assert (plan.progress.done, plan.progress.total) == (2, 3)


async def test_cancel_interrupts_a_slow_command(
    client: ACPClient, project: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    pid_file = tmp_path / "pid"
    script = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
    await add_command_tool(client, "slow", [PY, "-c", script, "{{pid_file}}"])
    await add_profile(client, "cmds", allowed_tools=["slow"])
    await add_action(
        client,
        steps=[
            {"tool": "fs.write", "args": {"path": "first.txt", "content": "1"}},
            {"tool": "slow", "args": {"pid_file": str(pid_file)}},
            {"tool": "fs.write", "args": {"path": "never.txt", "content": "2"}},
        ],
        profile="cmds",
    )
    plan = await use(client, {})
    started = await client.call("plan.execute", plan_id=plan.meta.id)
    assert isinstance(started, plan_pb2.ExecutePlanResponse)
    assert started.plan.state == plan_pb2.PLAN_STATE_RUNNING

    async def pid_written() -> bool:
        return pid_file.exists() and bool(pid_file.read_text())

    await eventually(pid_written)
    pid = int(pid_file.read_text())
    began = time.monotonic()
    cancelled = await client.call("plan.cancel", plan_id=plan.meta.id, reason="changed my mind")
    assert isinstance(cancelled, plan_pb2.CancelPlanResponse)
    assert time.monotonic() - began < 5
    assert (cancelled.plan.phase, cancelled.plan.state) == (
        plan_pb2.PLAN_PHASE_EXECUTE,
        plan_pb2.PLAN_STATE_CANCELLED,
    )
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    tree = await client.call("plan.tree", plan_id=plan.meta.id)
    assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
    assert [s.state for s in tree.steps] == [
        plan_pb2.PLAN_STATE_SUCCEEDED,
        plan_pb2.PLAN_STATE_CANCELLED,
        plan_pb2.PLAN_STATE_PENDING,
    ]
    events = await plan_events(client, plan.meta.id)
    final = [e.plan_state_changed for e in events if e.type == "plan.state_changed"][-1]
    assert (final.to_state, final.reason) == (plan_pb2.PLAN_STATE_CANCELLED, "changed my mind")
    for operation in ("plan.cancel", "plan.execute", "plan.apply"):
        with pytest.raises(ACPError) as info:
            await client.call(operation, plan_id=plan.meta.id)
        assert info.value.code == "INVALID_STATE"


async def test_command_tools_need_the_profile_and_stage_what_they_change(
    client: ACPClient, project: pathlib.Path
) -> None:
    script = (
        "import pathlib; p = pathlib.Path('src/app.py'); p.write_text(p.read_text().upper()); "
        "pathlib.Path('obsolete.txt').unlink()"
    )
    await add_command_tool(client, "shout", [PY, "-c", script])
    await add_command_tool(client, "sleepy", [PY, "-c", "import time; time.sleep(30)"], timeout_seconds=1)
    await add_command_tool(
        client, "fails", [PY, "-c", "import sys; sys.stderr.write('bad thing\\n'); sys.exit(4)"]
    )
    await add_action(client, name="act", steps=[{"tool": "shout", "args": {}}])
    refused = await run(client, (await use(client, {})).meta.id)
    assert refused.last_error.code == "tool_not_allowed"

    await add_profile(client, "cmds", allowed_tools=["shout", "sleepy", "fails"])
    # A profile given at plan.use cannot grant a command the action's own profile lacks.
    widened = await run(client, (await use(client, {}, automation_profile="cmds")).meta.id)
    assert widened.last_error.code == "tool_not_allowed"

    await add_action(client, name="act2", steps=[{"tool": "shout", "args": {}}], profile="cmds")
    before = snapshot(project)
    plan = await run(client, (await use(client, {}, action="act2")).meta.id)
    assert plan.state == plan_pb2.PLAN_STATE_SUCCEEDED
    assert snapshot(project) == before
    artifacts = await client.call("plan.artifacts", plan_id=plan.meta.id, include_content=True)
    assert isinstance(artifacts, plan_pb2.ListPlanArtifactsResponse)
    assert {a.path: (a.op, a.content) for a in artifacts.artifacts} == {
        "obsolete.txt": (plan_pb2.ARTIFACT_OP_DELETE, ""),
        "src/app.py": (plan_pb2.ARTIFACT_OP_MODIFY, "DEF MAIN():\n    RETURN 'OLD'\n"),
    }

    for tool, code in (("sleepy", "timeout"), ("fails", "command_failed")):
        await add_action(client, name=tool, steps=[{"tool": tool, "args": {}}], profile="cmds")
        failed = await run(client, (await use(client, {}, action=tool)).meta.id)
        assert (failed.state, failed.last_error.code) == (plan_pb2.PLAN_STATE_FAILED, "step_failed")
        tree = await client.call("plan.tree", plan_id=failed.meta.id)
        assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
        assert tree.steps[0].error.code == code
    assert "exited with 4: bad thing" in failed.last_error.message


async def test_correction_replaces_a_step_and_reruns_from_it(
    client: ACPClient, project: pathlib.Path
) -> None:
    await add_action(client)
    before = snapshot(project)
    plan = await run(client, (await use(client)).meta.id)
    tree = await client.call("plan.tree", plan_id=plan.meta.id)
    assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
    modify_node = next(n for n in tree.nodes if list(n.step_ids) == ["modify"])

    corrected = await client.call(
        "plan.correct",
        plan_id=plan.meta.id,
        node_id=modify_node.id,
        text="say corrected, not new",
        overrides=[
            {"step_id": "modify", "args": {"path": "src/app.py", "old": "'old'", "new": "'corrected'"}}
        ],
    )
    assert isinstance(corrected, plan_pb2.CorrectPlanResponse)
    assert (corrected.plan.phase, corrected.plan.state) == (
        plan_pb2.PLAN_PHASE_EXECUTE,
        plan_pb2.PLAN_STATE_PENDING,
    )
    assert corrected.node.correction == "say corrected, not new"
    assert corrected.node.parent_id == modify_node.parent_id
    assert list(corrected.node.step_ids) == ["modify~1"]
    assert "'corrected'" in corrected.node.choice

    tree = await client.call("plan.tree", plan_id=plan.meta.id)
    assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
    assert next(n for n in tree.nodes if n.id == modify_node.id).superseded
    assert [(s.id, s.state) for s in tree.steps] == [
        ("create", plan_pb2.PLAN_STATE_SUCCEEDED),
        ("modify", plan_pb2.PLAN_STATE_CANCELLED),
        ("modify~1", plan_pb2.PLAN_STATE_PENDING),
        ("delete", plan_pb2.PLAN_STATE_PENDING),
    ]
    assert tree.steps[1].error.code == "superseded"
    artifacts = await client.call("plan.artifacts", plan_id=plan.meta.id)
    assert isinstance(artifacts, plan_pb2.ListPlanArtifactsResponse)
    assert [a.path for a in artifacts.artifacts] == ["docs/guide.md"], "the branch's artifacts are discarded"

    with pytest.raises(ACPError) as info:
        await client.call("plan.correct", plan_id=plan.meta.id, node_id=modify_node.id, text="again")
    assert (info.value.code, info.value.details["field"]) == ("INVALID_PARAMS", "node_id")

    plan = await run(client, plan.meta.id)
    assert plan.state == plan_pb2.PLAN_STATE_SUCCEEDED
    assert (plan.progress.done, plan.progress.total) == (3, 3)
    diff = await client.call("plan.diff", plan_id=plan.meta.id)
    assert isinstance(diff, plan_pb2.GetPlanDiffResponse)
    assert "+    return 'corrected'\n" in next(f.unified_diff for f in diff.files if f.path == "src/app.py")
    prompt = await client.call("plan.prompt", plan_id=plan.meta.id)
    assert isinstance(prompt, plan_pb2.GetPlanPromptResponse)
    assert list(prompt.corrections) == ["say corrected, not new"]
    assert prompt.full_text.endswith("# Corrections\n1. say corrected, not new\n")
    explained = await client.call("plan.explain", plan_id=plan.meta.id)
    assert isinstance(explained, plan_pb2.ExplainPlanResponse)
    assert "[superseded]" in explained.text
    assert "correction: say corrected, not new" in explained.text

    await client.call("plan.apply", plan_id=plan.meta.id)
    assert (project / "src/app.py").read_text() == "def main():\n    return 'corrected'\n"
    with pytest.raises(ACPError) as info:
        await client.call("plan.correct", plan_id=plan.meta.id, node_id=corrected.node.id, text="too late")
    assert info.value.code == "INVALID_STATE"
    await client.call("plan.rollback", plan_id=plan.meta.id)
    assert snapshot(project) == before


async def test_correcting_the_root_can_drop_a_step(client: ACPClient, project: pathlib.Path) -> None:
    await add_action(client)
    plan = await run(client, (await use(client)).meta.id)
    tree = await client.call("plan.tree", plan_id=plan.meta.id)
    assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
    root = tree.nodes[0]
    with pytest.raises(ACPError) as info:
        await client.call(
            "plan.correct", plan_id=plan.meta.id, node_id=root.id, overrides=[{"step_id": "nope"}]
        )
    assert (info.value.code, info.value.details["field"]) == ("INVALID_PARAMS", "overrides[0].step_id")
    with pytest.raises(ACPError) as info:
        await client.call("plan.correct", plan_id=plan.meta.id, node_id="d99")
    assert info.value.code == "INVALID_PARAMS"
    with pytest.raises(ACPError) as info:
        await client.call(
            "plan.correct",
            plan_id=plan.meta.id,
            node_id=root.id,
            overrides=[{"step_id": "delete", "tool": "no.such"}],
        )
    assert (info.value.code, info.value.details["field"]) == ("INVALID_PARAMS", "overrides[0].tool")
    corrected = await client.call(
        "plan.correct",
        plan_id=plan.meta.id,
        node_id=root.id,
        text="keep obsolete.txt",
        overrides=[{"step_id": "delete", "remove": True}],
    )
    assert isinstance(corrected, plan_pb2.CorrectPlanResponse)
    tree = await client.call("plan.tree", plan_id=plan.meta.id)
    assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
    assert sum(1 for n in tree.nodes if not n.superseded) == 3
    assert all(n.superseded for n in tree.nodes[:4])
    plan = await run(client, plan.meta.id)
    artifacts = await client.call("plan.artifacts", plan_id=plan.meta.id)
    assert isinstance(artifacts, plan_pb2.ListPlanArtifactsResponse)
    assert [a.path for a in artifacts.artifacts] == ["docs/guide.md", "src/app.py"]


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("../escape.txt", "'..'"),
        ("/etc/passwd", "absolute"),
        ("link/x.txt", "outside"),
        ("", "names no file"),
    ],
)
async def test_paths_outside_the_resource_are_refused(
    client: ACPClient, project: pathlib.Path, tmp_path: pathlib.Path, path: str, why: str
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (project / "link").symlink_to(outside)
    await add_action(client, steps=[{"tool": "fs.write", "args": {"path": path, "content": "x"}}])
    plan = await run(client, (await use(client, {})).meta.id)
    assert plan.state == plan_pb2.PLAN_STATE_FAILED
    tree = await client.call("plan.tree", plan_id=plan.meta.id)
    assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
    assert tree.steps[0].error.code == "INVALID_PARAMS"
    assert why in tree.steps[0].error.message
    assert list(outside.iterdir()) == []
    assert not (tmp_path / "escape.txt").exists()


async def test_inside_symlinks_resolve_and_replace_needs_one_match(
    client: ACPClient, project: pathlib.Path
) -> None:
    (project / "alias.py").symlink_to(project / "src/app.py")
    await add_action(
        client, steps=[{"tool": "fs.replace", "args": {"path": "alias.py", "old": "old", "new": "x"}}]
    )
    plan = await run(client, (await use(client, {})).meta.id)
    artifacts = await client.call("plan.artifacts", plan_id=plan.meta.id)
    assert isinstance(artifacts, plan_pb2.ListPlanArtifactsResponse)
    assert [a.path for a in artifacts.artifacts] == ["src/app.py"]
    for old, count in (("zzz", 0), ("e", 2)):
        await add_action(
            client,
            name=f"r{count}",
            steps=[{"tool": "fs.replace", "args": {"path": "README.md", "old": old, "new": "x"}}],
        )
        failed = await run(client, (await use(client, {}, action=f"r{count}")).meta.id)
        assert failed.state == plan_pb2.PLAN_STATE_FAILED
        assert f"found {count}" in failed.last_error.message


async def test_read_only_resources_are_never_written(client: ACPClient, tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "ro"
    write_tree(folder)
    await client.call(
        "resource.add", name="ro", spec={"type": "directory", "path": str(folder), "read_only": True}
    )
    await client.call("project.add", name="proj", spec={"resources": ["ro"]})
    await add_action(
        client,
        steps=[
            {"tool": "fs.read", "args": {"path": "README.md"}},
            {"tool": "fs.list", "args": {"path": "src"}},
            {"tool": "fs.write", "args": {"path": "README.md", "content": "no"}},
        ],
    )
    plan = await run(client, (await use(client, {})).meta.id)
    assert plan.state == plan_pb2.PLAN_STATE_FAILED
    assert "read-only" in plan.last_error.message
    completed = [
        e.tool_completed for e in await plan_events(client, plan.meta.id) if e.type == "tool.completed"
    ]
    assert completed[0].result["content"] == "# Demo\n\nHello.\n"
    assert completed[1].result["paths"] == ["src/app.py"]
    assert not completed[2].ok


async def test_auto_execute_and_auto_apply(client: ACPClient, project: pathlib.Path) -> None:
    await add_profile(client, "hands-off", auto_execute=True, auto_apply=True)
    await add_action(client, profile="hands-off")
    plan = await use(client)
    assert plan.automation_profile == "hands-off"

    async def applying() -> bool:
        return (await status(client, plan.meta.id)).phase == plan_pb2.PLAN_PHASE_APPLY

    await eventually(applying)
    done = await wait_for(client, plan.meta.id, plan_pb2.PLAN_STATE_SUCCEEDED)
    assert done.phase == plan_pb2.PLAN_PHASE_APPLY
    assert (project / "docs/guide.md").read_text() == "# The guide\n"
    assert not (project / "obsolete.txt").exists()


async def test_a_project_of_several_resources(client: ACPClient, tmp_path: pathlib.Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    write_tree(first)
    second.mkdir()
    for name, folder in (("one", first), ("two", second)):
        await client.call("resource.add", name=name, spec={"type": "directory", "path": str(folder)})
    await client.call("project.add", name="proj", spec={"resources": ["one", "two"]})
    await add_action(
        client, name="vague", steps=[{"tool": "fs.write", "args": {"path": "x", "content": "x"}}]
    )
    vague = await run(client, (await use(client, {}, action="vague")).meta.id)
    assert "name one with `resource`" in vague.last_error.message
    await add_action(
        client,
        steps=[
            {"tool": "fs.write", "args": {"resource": "two", "path": "copy.md", "content": "copied"}},
            {"tool": "fs.delete", "args": {"resource": "one", "path": "obsolete.txt"}},
        ],
    )
    plan = await run(client, (await use(client, {})).meta.id)
    artifacts = await client.call("plan.artifacts", plan_id=plan.meta.id)
    assert isinstance(artifacts, plan_pb2.ListPlanArtifactsResponse)
    assert [(a.resource, a.path, a.op) for a in artifacts.artifacts] == [
        ("one", "obsolete.txt", plan_pb2.ARTIFACT_OP_DELETE),
        ("two", "copy.md", plan_pb2.ARTIFACT_OP_CREATE),
    ]
    await client.call("plan.apply", plan_id=plan.meta.id)
    assert (second / "copy.md").read_text() == "copied"
    assert not (first / "obsolete.txt").exists()
