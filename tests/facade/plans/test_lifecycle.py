"""A plan end to end through the in-process client: use, execute, the read views, apply,
rollback, over a real folder."""

from __future__ import annotations

import hashlib
import os
import pathlib
import threading
from collections.abc import Iterator

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.beneath import Anchor
from cleveragents.acp.facade.domain.plans import actor, paths
from cleveragents.acp.v1 import plan_pb2
from tests.facade.plans.helpers import (
    INPUTS,
    ORIGINAL,
    SCHEMA,
    add_action,
    add_project,
    run,
    snapshot,
    status,
    use,
    write_tree,
)


@pytest.fixture
async def project(client: ACPClient, tmp_path: pathlib.Path) -> pathlib.Path:
    folder = tmp_path / "repo"
    write_tree(folder)
    await add_project(client, folder)
    await add_action(client, schema=SCHEMA, prompt="Write the {{name}} guide.")
    return folder


async def test_use_execute_diff_apply_rollback(client: ACPClient, project: pathlib.Path) -> None:
    before = snapshot(project)
    plan = await use(client)
    assert (plan.phase, plan.state) == (plan_pb2.PLAN_PHASE_STRATEGIZE, plan_pb2.PLAN_STATE_PENDING)
    assert plan.progress.total == 3
    assert dict(plan.inputs) == INPUTS

    plan = await run(client, plan.meta.id)
    assert (plan.phase, plan.state) == (plan_pb2.PLAN_PHASE_EXECUTE, plan_pb2.PLAN_STATE_SUCCEEDED)
    assert (plan.progress.done, plan.progress.total) == (3, 3)
    assert snapshot(project) == before, "execute must never touch the project"

    artifacts = await client.call("plan.artifacts", plan_id=plan.meta.id, include_content=True)
    assert isinstance(artifacts, plan_pb2.ListPlanArtifactsResponse)
    by_path = {a.path: a for a in artifacts.artifacts}
    assert {p: a.op for p, a in by_path.items()} == {
        "docs/guide.md": plan_pb2.ARTIFACT_OP_CREATE,
        "obsolete.txt": plan_pb2.ARTIFACT_OP_DELETE,
        "src/app.py": plan_pb2.ARTIFACT_OP_MODIFY,
    }
    created = by_path["docs/guide.md"]
    assert created.content == "# The guide\n"
    assert created.size == len(b"# The guide\n")
    assert created.sha256 == hashlib.sha256(b"# The guide\n").hexdigest()
    assert created.step_id == "create"
    assert created.resource == "repo"
    assert by_path["src/app.py"].step_id == "modify"
    assert by_path["obsolete.txt"].size == 0
    assert by_path["obsolete.txt"].sha256 == ""

    diff = await client.call("plan.diff", plan_id=plan.meta.id)
    assert isinstance(diff, plan_pb2.GetPlanDiffResponse)
    diffs = {f.path: f.unified_diff for f in diff.files}
    assert diffs["docs/guide.md"].startswith("--- /dev/null\n+++ b/docs/guide.md\n")
    assert "+# The guide\n" in diffs["docs/guide.md"]
    assert "-    return 'old'\n+    return 'new'\n" in diffs["src/app.py"]
    assert diffs["obsolete.txt"].startswith("--- a/obsolete.txt\n+++ /dev/null\n")

    applied = await client.call("plan.apply", plan_id=plan.meta.id)
    assert isinstance(applied, plan_pb2.ApplyPlanResponse)
    assert sorted(applied.changed_paths) == ["docs/guide.md", "obsolete.txt", "src/app.py"]
    assert (applied.plan.phase, applied.plan.state) == (
        plan_pb2.PLAN_PHASE_APPLY,
        plan_pb2.PLAN_STATE_SUCCEEDED,
    )
    assert (project / "docs/guide.md").read_bytes() == b"# The guide\n"
    assert (project / "src/app.py").read_bytes() == b"def main():\n    return 'new'\n"
    assert not (project / "obsolete.txt").exists()
    assert (project / "data/blob.bin").read_bytes() == ORIGINAL["data/blob.bin"]
    after_diff = await client.call("plan.diff", plan_id=plan.meta.id)
    assert isinstance(after_diff, plan_pb2.GetPlanDiffResponse)
    assert list(after_diff.files) == [], "once applied, nothing differs"

    rolled = await client.call("plan.rollback", plan_id=plan.meta.id)
    assert isinstance(rolled, plan_pb2.RollbackPlanResponse)
    assert rolled.plan.state == plan_pb2.PLAN_STATE_ROLLED_BACK
    assert sorted(rolled.restored_paths) == ["docs/guide.md", "obsolete.txt", "src/app.py"]
    assert snapshot(project) == before, "rollback restores the folder byte for byte"
    with pytest.raises(ACPError) as info:
        await client.call("plan.rollback", plan_id=plan.meta.id)
    assert info.value.code == "INVALID_STATE"


async def test_rollback_refuses_files_changed_since_apply_unless_forced(
    client: ACPClient, project: pathlib.Path
) -> None:
    before = snapshot(project)
    plan = await use(client)
    await run(client, plan.meta.id)
    await client.call("plan.apply", plan_id=plan.meta.id)
    (project / "src/app.py").write_text("edited by a person\n")
    (project / "obsolete.txt").write_text("came back\n")
    with pytest.raises(ACPError) as info:
        await client.call("plan.rollback", plan_id=plan.meta.id)
    assert info.value.code == "INVALID_STATE"
    assert info.value.details["paths"] == ["obsolete.txt", "src/app.py"]
    assert (project / "src/app.py").read_text() == "edited by a person\n"
    assert (await status(client, plan.meta.id)).state == plan_pb2.PLAN_STATE_SUCCEEDED
    await client.call("plan.rollback", plan_id=plan.meta.id, force=True)
    assert snapshot(project) == before


async def test_read_views(client: ACPClient, project: pathlib.Path) -> None:
    plan = await use(client)
    with pytest.raises(ACPError) as info:
        await client.call("plan.prompt", plan_id=plan.meta.id)
    assert info.value.code == "INVALID_STATE"
    plan = await run(client, plan.meta.id)

    tree = await client.call("plan.tree", plan_id=plan.meta.id)
    assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
    root, *children = tree.nodes
    assert root.parent_id == ""
    assert [c.parent_id for c in children] == [root.id] * 3
    assert [c.step_ids[0] for c in children] == ["create", "modify", "delete"]
    assert all(n.event_sequence > 0 for n in tree.nodes)
    assert [s.id for s in tree.steps] == ["create", "modify", "delete"]
    assert all(s.state == plan_pb2.PLAN_STATE_SUCCEEDED and s.duration_ms >= 0 for s in tree.steps)
    assert tree.steps[0].args["path"] == "docs/guide.md"
    assert children[0].choice == "fs.write(content='# The guide\\n', path='docs/guide.md')"

    explained = await client.call("plan.explain", plan_id=plan.meta.id)
    assert isinstance(explained, plan_pb2.ExplainPlanResponse)
    assert list(explained.decisions) == list(tree.nodes)
    assert "How should action 'act' be carried out" in explained.text
    assert f"event {root.event_sequence}" in explained.text

    prompt = await client.call("plan.prompt", plan_id=plan.meta.id)
    assert isinstance(prompt, plan_pb2.GetPlanPromptResponse)
    assert prompt.action_prompt == "Write the guide guide."
    assert "Resource repo: directory" in prompt.context
    assert "  src/app.py" in prompt.context
    assert prompt.full_text.endswith("# Task\nWrite the guide guide.\n")
    assert list(prompt.corrections) == []

    current = await status(client, plan.meta.id)
    assert current.cost.spent == 0
    assert current.cost.budget == 0
    assert [t.phase for t in current.timings] == [plan_pb2.PLAN_PHASE_STRATEGIZE, plan_pb2.PLAN_PHASE_EXECUTE]
    assert all(t.end_time.ToNanoseconds() >= t.start_time.ToNanoseconds() > 0 for t in current.timings)
    assert not current.HasField("last_error")


async def test_list_filters_and_pages(
    client: ACPClient, project: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    ids = [(await use(client)).meta.id for _ in range(5)]
    await run(client, ids[0])
    page = await client.call("plan.list", page_size=2)
    assert isinstance(page, plan_pb2.ListPlansResponse)
    seen = [p.meta.id for p in page.plans]
    while page.next_page_token:
        page = await client.call("plan.list", page_size=2, page_token=page.next_page_token)
        assert isinstance(page, plan_pb2.ListPlansResponse)
        seen += [p.meta.id for p in page.plans]
    assert seen == list(reversed(ids))
    done = await client.call("plan.list", state="PLAN_STATE_SUCCEEDED")
    assert isinstance(done, plan_pb2.ListPlansResponse)
    assert [p.meta.id for p in done.plans] == [ids[0]]
    other = await client.call("plan.list", project="nope")
    assert isinstance(other, plan_pb2.ListPlansResponse)
    assert list(other.plans) == []
    with pytest.raises(ACPError) as info:
        await client.call(
            "plan.list", page_size=2, state="PLAN_STATE_PENDING", page_token=page.next_page_token or "x"
        )
    assert info.value.code == "INVALID_PARAMS"
    with pytest.raises(ACPError) as info:
        await client.call("plan.list", page_size=-1)
    assert info.value.code == "INVALID_PARAMS"


async def test_bad_inputs_are_invalid_params(client: ACPClient, project: pathlib.Path) -> None:
    with pytest.raises(ACPError) as info:
        await use(client, {"name": "x"})
    assert info.value.code == "INVALID_PARAMS"
    assert "word" in info.value.message
    with pytest.raises(ACPError) as info:
        await use(client, {"name": 3, "word": "w"})
    assert info.value.code == "INVALID_PARAMS"
    with pytest.raises(ACPError) as info:
        await client.call("plan.use", action="missing", project="proj")
    assert (info.value.code, info.value.details["refinement"]) == ("NOT_FOUND", "ACTION_NOT_FOUND")
    with pytest.raises(ACPError) as info:
        await client.call("plan.use", action="act", project="missing", inputs=INPUTS)
    assert (info.value.code, info.value.details["refinement"]) == ("NOT_FOUND", "PROJECT_NOT_FOUND")
    with pytest.raises(ACPError) as info:
        await client.call("plan.status", plan_id="01NOSUCHPLAN")
    assert (info.value.code, info.value.details["refinement"]) == ("NOT_FOUND", "PLAN_NOT_FOUND")
    with pytest.raises(ACPError) as info:
        await client.call("plan.use", action="act", project="proj", inputs=INPUTS, session_id="nosuch")
    assert (info.value.code, info.value.details["refinement"]) == ("NOT_FOUND", "SESSION_NOT_FOUND")
    with pytest.raises(ACPError) as info:
        await client.call("plan.use", project="proj")
    assert info.value.code == "INVALID_PARAMS"


async def test_a_placeholder_without_an_input_is_refused_at_use(
    client: ACPClient, project: pathlib.Path
) -> None:
    await add_action(
        client, name="typo", steps=[{"tool": "fs.write", "args": {"path": "{{nmae}}.txt", "content": "x"}}]
    )
    with pytest.raises(ACPError) as info:
        await client.call("plan.use", action="typo", project="proj", inputs={"name": "a"})
    assert info.value.code == "INVALID_PARAMS"
    assert info.value.details["placeholder"] == "nmae"


async def test_use_checks_the_prompt_template_and_walks_no_folder_on_the_event_loop(
    client: ACPClient, project: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The prompt's context lists the project's files: a walk as long as the folder is big,
    so never on the loop's thread (it stalled every other call while plan.use ran) nor on
    the store's writer (every commit waited for it); a missing input of the prompt template
    is still refused at use."""
    walked_on: list[threading.Thread] = []
    walk = paths._walk

    def recorded(root: pathlib.Path, below: str, anchor: Anchor | None) -> Iterator[str | None]:
        walked_on.append(threading.current_thread())
        yield from walk(root, below, anchor)

    def assert_walked_on_workers() -> None:
        assert walked_on, "the prompt lists the project's files"
        assert threading.current_thread() not in walked_on
        assert [thread.name for thread in walked_on if thread.name.startswith("acp-store")] == []
        walked_on.clear()

    monkeypatch.setattr(paths, "_walk", recorded)
    plan = await use(client)
    assert walked_on == []
    plan = await run(client, plan.meta.id)
    assert plan.state == plan_pb2.PLAN_STATE_SUCCEEDED
    assert_walked_on_workers()
    tree = await client.call("plan.tree", plan_id=plan.meta.id)
    assert isinstance(tree, plan_pb2.GetPlanTreeResponse)
    await client.call("plan.correct", plan_id=plan.meta.id, node_id=tree.nodes[0].id, text="shorter")
    assert_walked_on_workers()

    await add_action(client, name="typo", schema=SCHEMA, prompt="Write the {{nmae}} guide.")
    with pytest.raises(ACPError) as info:
        await client.call("plan.use", action="typo", project="proj", inputs=INPUTS)
    assert info.value.code == "INVALID_PARAMS"
    assert info.value.details["placeholder"] == "nmae"


def test_first_files_walks_at_most_its_limit_and_says_when_it_stopped(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tree(tmp_path, {f"d{n % 3}/f{n:02}.txt": b"x" for n in range(30)})
    (tmp_path / "out").symlink_to("/")  # a link leading out: skipped, but counted as met
    everything = paths.walk_files(tmp_path)
    assert len(everything) == 30
    assert paths.first_files(tmp_path, 1000) == (everything, False)
    checked: list[str] = []
    file_of = paths._file_of

    def counted(
        root_fd: int, place: Anchor, relative: str, entry: os.DirEntry[str], prefix: str
    ) -> str | None:
        checked.append(relative)
        return file_of(root_fd, place, relative, entry, prefix)

    monkeypatch.setattr(paths, "_file_of", counted)
    found, more = paths.first_files(tmp_path, 10)
    assert more
    assert len(checked) <= 10
    assert 0 < len(found) < 10
    assert set(found) <= set(everything)
    assert found == sorted(found)


def test_first_files_stops_inside_one_huge_folder(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder is read entry by entry: stopping after 50 entries reads about 50 names of a
    folder of 3,000, not all of them first (os.walk lists a folder whole)."""
    write_tree(tmp_path, {f"many/f{n:04}.txt": b"x" for n in range(3000)})
    read: list[str] = []
    scandir = os.scandir

    class Counted:
        def __init__(self, path: str) -> None:
            self._entries = scandir(path)

        def __enter__(self) -> Counted:
            return self

        def __exit__(self, *exc: object) -> None:
            self._entries.close()

        def __iter__(self) -> Counted:
            return self

        def __next__(self) -> os.DirEntry[str]:
            entry = next(self._entries)
            read.append(entry.name)
            return entry

    monkeypatch.setattr(os, "scandir", Counted)
    found, more = paths.first_files(tmp_path, 50)
    assert more
    assert len(read) <= 52
    assert 0 < len(found) <= 50
    monkeypatch.undo()
    assert len(paths.walk_files(tmp_path)) == 3000


def test_the_walk_skips_links_to_folders_and_out_and_finds_linked_files(tmp_path: pathlib.Path) -> None:
    write_tree(tmp_path, {"a/one.txt": b"1", "a/b/two.txt": b"2"})
    (tmp_path / "a" / "to_b").symlink_to(tmp_path / "a" / "b")
    (tmp_path / "out").symlink_to("/etc")
    (tmp_path / "passwd").symlink_to("/etc/passwd")
    (tmp_path / "again.txt").symlink_to(tmp_path / "a" / "one.txt")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / "pipe")
    assert paths.walk_files(tmp_path) == ["a/b/two.txt", "a/one.txt"]
    assert paths.walk_files(tmp_path, "a/b") == ["a/b/two.txt"]


async def test_the_prompt_of_a_project_bigger_than_the_walk_says_the_walk_stopped(
    client: ACPClient, project: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(actor, "CONTEXT_WALK_FILES", 4)
    plan = await run(client, (await use(client)).meta.id)
    prompt = await client.call("plan.prompt", plan_id=plan.meta.id)
    assert isinstance(prompt, plan_pb2.GetPlanPromptResponse)
    assert "  ... and more files (the walk stopped after 4 entries)" in prompt.context
