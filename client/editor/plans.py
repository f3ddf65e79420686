"""A plan as Zed ACP shows work: a ``plan`` update (one entry per step) and a tool call per
step, of the kind its tool is (``fs.read`` reads, ``fs.write`` edits, ``fs.delete`` deletes,
a command tool executes), with the diff of what the step staged as its content.

``PlanView`` reads the plan (tree, artifacts, diff) and sends only what changed since it
last did, so the same view serves a live run (refreshed at each of the plan's events) and
a replay (``session/load``: refreshed once).
"""

from __future__ import annotations

import posixpath
import re
from typing import Any

from acp import helpers
from acp.schema import (
    AgentPlanUpdate,
    ContentToolCallContent,
    FileEditToolCallContent,
    PlanEntry,
    ToolCallLocation,
    ToolCallProgress,
    ToolCallStart,
    ToolCallStatus,
)
from google.protobuf import json_format

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.v1 import plan_pb2

Update = AgentPlanUpdate | ToolCallStart | ToolCallProgress

# What each built-in tool does, as a Zed ACP tool kind; a registered (command) tool executes.
TOOL_KINDS = {
    "fs.read": "read",
    "fs.list": "read",
    "fs.write": "edit",
    "fs.replace": "edit",
    "fs.delete": "delete",
}
_STATUS: dict[int, ToolCallStatus] = {
    plan_pb2.PLAN_STATE_PENDING: "pending",
    plan_pb2.PLAN_STATE_RUNNING: "in_progress",
    plan_pb2.PLAN_STATE_SUCCEEDED: "completed",
    plan_pb2.PLAN_STATE_FAILED: "failed",
    plan_pb2.PLAN_STATE_CANCELLED: "failed",
    plan_pb2.PLAN_STATE_ROLLED_BACK: "failed",
}
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def tool_kind(tool: str) -> Any:
    return TOOL_KINDS.get(tool, "execute")


def old_text(new: str, unified_diff: str) -> str:
    """The text before a unified diff, from the text after it (the diff read backwards)."""
    new_lines = new.splitlines(keepends=True)
    old: list[str] = []
    at = 0  # next line of ``new`` not yet copied
    lines = unified_diff.splitlines(keepends=True)
    i = 0
    while i < len(lines):
        hunk = _HUNK.match(lines[i])
        i += 1
        if hunk is None:
            continue
        start = int(hunk.group(3))
        count = int(hunk.group(4)) if hunk.group(4) is not None else 1
        first = start - 1 if count else start
        old.extend(new_lines[at:first])
        at = first
        while i < len(lines) and not lines[i].startswith("@@"):
            line = lines[i]
            i += 1
            if line.startswith("\\"):
                if old and old[-1].endswith("\n") and lines[i - 2].startswith(("-", " ")):
                    old[-1] = old[-1][:-1]
                continue
            if line.startswith((" ", "-")):
                old.append(line[1:])
            if line.startswith((" ", "+")):
                at += 1
    old.extend(new_lines[at:])
    return "".join(old)


class PlanView:
    """What the client has been shown of one plan."""

    def __init__(self, client: ACPClient, plan_id: str, folders: dict[str, str]) -> None:
        self.client = client
        self.plan_id = plan_id
        # Resource name -> its folder, for absolute paths in locations and diffs.
        self.folders = folders
        self.plan = plan_pb2.Plan()
        self.steps: list[plan_pb2.PlanStep] = []
        self._sent: dict[str, tuple[str, int]] = {}
        self._entries: list[tuple[str, str]] = []
        self.diff = plan_pb2.GetPlanDiffResponse()
        self._artifacts: list[plan_pb2.Artifact] = []

    def call_id(self, step_id: str) -> str:
        return f"{self.plan_id}/{step_id}"

    def path(self, resource: str, path: str) -> str:
        folder = self.folders.get(resource)
        return posixpath.join(folder, path) if folder else path

    async def refresh(self) -> list[Update]:
        """Read the plan again; the updates that tell the client what changed."""
        status = await self.client.call("plan.status", plan_id=self.plan_id)
        self.plan = status.plan  # type: ignore[attr-defined]
        tree = await self.client.call("plan.tree", plan_id=self.plan_id)
        self.steps = list(tree.steps)  # type: ignore[attr-defined]
        done = {s.id for s in self.steps if s.state != plan_pb2.PLAN_STATE_PENDING}
        contents = await self._contents() if done else {}
        updates: list[Update] = []
        entries = [(self._title(s), _entry_status(s.state)) for s in self.steps]
        if entries and entries != self._entries:
            self._entries = entries
            updates.append(
                helpers.update_plan(
                    [PlanEntry(content=title, priority="medium", status=status) for title, status in entries]
                )
            )
        for step in self.steps:
            updates.extend(self._step_updates(step, contents.get(step.id, [])))
        return updates

    def _title(self, step: plan_pb2.PlanStep) -> str:
        if step.description:
            return step.description
        args = json_format.MessageToDict(step.args)
        target = args.get("path") or args.get("command") or ""
        return f"{step.tool} {target}".strip()

    def _step_updates(self, step: plan_pb2.PlanStep, content: list[Any]) -> list[Update]:
        call_id = self.call_id(step.id)
        status: ToolCallStatus = _STATUS.get(plan_pb2.PlanState.ValueType(step.state), "pending")
        args = json_format.MessageToDict(step.args)
        shown = (status, len(content))
        before = self._sent.get(call_id)
        if before == shown:
            return []
        self._sent[call_id] = shown
        locations = (
            [ToolCallLocation(path=self.path(self._resource(step.id), str(args["path"])))]
            if "path" in args
            else None
        )
        if before is None:
            return [
                helpers.start_tool_call(
                    call_id,
                    self._title(step),
                    kind=tool_kind(step.tool),
                    status=status,
                    content=content or None,
                    locations=locations,
                    raw_input=args,
                )
            ]
        error = [_text(f"{step.error.code}: {step.error.message}")] if step.error.code else []
        return [helpers.update_tool_call(call_id, status=status, content=(content + error) or None)]

    def _resource(self, step_id: str) -> str:
        found = next((a.resource for a in self._artifacts if a.step_id == step_id), "")
        return found or (next(iter(self.folders)) if len(self.folders) == 1 else "")

    async def _contents(self) -> dict[str, list[Any]]:
        """Per step, the diff of each file it staged (Zed ACP ``diff`` content: the text
        before and after) and the unified diff as text."""
        listed = await self.client.call("plan.artifacts", plan_id=self.plan_id, include_content=True)
        self._artifacts = list(listed.artifacts)  # type: ignore[attr-defined]
        if not self._artifacts:
            return {}
        self.diff = await self.client.call("plan.diff", plan_id=self.plan_id)  # type: ignore[assignment]
        diffs = {(d.resource, d.path): d for d in self.diff.files}
        found: dict[str, list[Any]] = {}
        for artifact in self._artifacts:
            diff = diffs.get((artifact.resource, artifact.path))
            found.setdefault(artifact.step_id, []).extend(self.file_content(artifact, diff))
        return found

    def file_content(self, artifact: plan_pb2.Artifact, diff: plan_pb2.FileDiff | None) -> list[Any]:
        path = self.path(artifact.resource, artifact.path)
        new = "" if artifact.op == plan_pb2.ARTIFACT_OP_DELETE else artifact.content
        unified = diff.unified_diff if diff is not None else ""
        before = None if artifact.op == plan_pb2.ARTIFACT_OP_CREATE else old_text(new, unified)
        content: list[Any] = [FileEditToolCallContent(type="diff", path=path, old_text=before, new_text=new)]
        return content

    def all_diffs(self) -> list[Any]:
        """The whole staged change, as the content of the apply's tool call."""
        diffs = {(d.resource, d.path): d for d in self.diff.files}
        content: list[Any] = []
        for artifact in self._artifacts:
            content.extend(self.file_content(artifact, diffs.get((artifact.resource, artifact.path))))
        text = "".join(d.unified_diff for d in self.diff.files)
        if text:
            content.append(_text(text))
        return content


def _entry_status(state: int) -> Any:
    status = _STATUS.get(plan_pb2.PlanState.ValueType(state), "pending")
    return "completed" if status == "failed" else status


def _text(text: str) -> ContentToolCallContent:
    return helpers.tool_content(helpers.text_block(text))
