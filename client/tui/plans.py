"""The plans list and one plan: status, the decision tree (collapsible, superseded branches
marked), the diff in colour, the explanation and the artifacts; execute, apply, rollback,
cancel and correct, each after a confirmation.

A plan's screen reads again when one of its events arrives (from any client), at most every
0.3 s; a tree of thousands of steps shows its decisions and keeps each one's steps folded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from rich.console import Group, RenderableType
from rich.syntax import Syntax
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.widgets import DataTable, Static, TabbedContent, TabPane, Tree
from textual.widgets.tree import TreeNode

from cleveragents.acp.client.tui.display import enum
from cleveragents.acp.client.tui.listing import Listing
from cleveragents.acp.client.tui.modals import Ask, Confirm
from cleveragents.acp.client.tui.page import Page
from cleveragents.acp.v1 import events_pb2, plan_pb2

# Steps listed under one decision before "… N more" (the rest are in plan.tree's answer).
STEPS_SHOWN = 200
# Trees of more decisions than this open with every decision folded.
UNFOLDED = 100


def plan_state(plan: plan_pb2.Plan) -> str:
    return f"{enum(plan_pb2.PlanPhase, plan.phase)}/{enum(plan_pb2.PlanState, plan.state)}"


class PlansScreen(Listing):
    OPERATION = "plan.list"
    WHAT = "plans"
    COLUMNS = ("id", "action", "project", "phase/state", "progress", "session")
    PLACEHOLDER = "/ filter: any text (action, project, state)"

    def cells(self, item: Any) -> Sequence[str]:
        show = self.acp.show
        return (
            show.id(item.meta.id),
            item.action,
            item.project,
            plan_state(item),
            f"{item.progress.done}/{item.progress.total}",
            show.id(item.session_id) if item.session_id else "-",
        )

    def open(self, key: str) -> None:
        self.app.push_screen(PlanScreen(key))

    def on_acp_event(self, event: events_pb2.Event) -> None:
        if event.plan_id:
            self.reload_soon()


class PlanScreen(Page):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "back", "Back"),
        Binding("x", "act('execute')", "Execute"),
        Binding("a", "act('apply')", "Apply"),
        Binding("b", "act('rollback')", "Rollback"),
        Binding("c", "act('cancel')", "Cancel"),
        Binding("o", "correct", "Correct"),
        Binding("y", "copy", "Copy id"),
        Binding("ctrl+r", "reload", "Reload"),
        Binding("1", "tab('status')", "Status", show=False),
        Binding("2", "tab('tree')", "Tree", show=False),
        Binding("3", "tab('diff')", "Diff", show=False),
        Binding("4", "tab('explain')", "Explain", show=False),
        Binding("5", "tab('artifacts')", "Artifacts", show=False),
    ]
    DEFAULT_CSS = """
    #tabs { height: 1fr; }
    Tree { height: 1fr; }
    """

    def __init__(self, plan_id: str) -> None:
        super().__init__()
        self.plan_id = plan_id
        self.plan: plan_pb2.Plan | None = None
        self.decisions: plan_pb2.GetPlanTreeResponse | None = None
        self.diff: plan_pb2.GetPlanDiffResponse | None = None
        self._reload_timer: object | None = None

    def body(self) -> ComposeResult:
        yield Static("loading the plan…", id="summary", classes="status")
        with TabbedContent(id="tabs"):
            with TabPane("1 Status", id="status"), VerticalScroll():
                yield Static("", id="status-text")
            with TabPane("2 Tree", id="tree"):
                yield Tree[str]("decisions", id="decisions")
            with TabPane("3 Diff", id="diff"), VerticalScroll():
                yield Static("", id="diff-text")
            with TabPane("4 Explain", id="explain"), VerticalScroll():
                yield Static("", id="explain-text")
            with TabPane("5 Artifacts", id="artifacts"):
                table: DataTable[str] = DataTable(id="artifact-table", cursor_type="row")
                table.add_columns("path", "op", "size", "sha256", "step")
                yield table

    def on_mount(self) -> None:
        self.load()

    @work(exclusive=True, group="load")
    async def load(self) -> None:
        status = await self.acp.call("plan.status", plan_id=self.plan_id)
        if status is None:
            return
        assert isinstance(status, plan_pb2.GetPlanStatusResponse)
        self.plan = status.plan
        self.show_status()
        tree = await self.acp.call("plan.tree", plan_id=self.plan_id)
        if isinstance(tree, plan_pb2.GetPlanTreeResponse):
            self.decisions = tree
            self.show_tree()
        diff = await self.quiet("plan.diff")
        self.diff = diff if isinstance(diff, plan_pb2.GetPlanDiffResponse) else None
        self.show_diff()
        explain = await self.quiet("plan.explain")
        self.query_one("#explain-text", Static).update(
            Text(self.acp.show.text(explain.text))
            if isinstance(explain, plan_pb2.ExplainPlanResponse)
            else "no explanation yet"
        )
        artifacts = await self.quiet("plan.artifacts")
        table = self.query_one("#artifact-table", DataTable)
        table.clear()
        if isinstance(artifacts, plan_pb2.ListPlanArtifactsResponse):
            for item in artifacts.artifacts:
                table.add_row(
                    item.path,
                    enum(plan_pb2.ArtifactOp, item.op),
                    str(item.size),
                    item.sha256[:12],
                    item.step_id,
                )

    async def quiet(self, operation: str) -> Any:
        """An answer that may not exist yet (a diff before execute): no error shown."""
        from cleveragents.acp.contract.errors import ACPError

        try:
            return await self.acp.client.call(operation, plan_id=self.plan_id)
        except ACPError as exc:
            if exc.code in ("INVALID_STATE", "NOT_FOUND"):
                return None
            self.acp.report(exc)
            return None

    def show_status(self) -> None:
        plan = self.plan
        if plan is None:
            return
        show = self.acp.show
        self.query_one("#summary", Static).update(
            Text(f"plan {show.id(plan.meta.id)} · {plan.action} on {plan.project} · {plan_state(plan)}")
        )
        lines = [
            f"phase     {enum(plan_pb2.PlanPhase, plan.phase)}",
            f"state     {enum(plan_pb2.PlanState, plan.state)}",
            f"progress  {plan.progress.done}/{plan.progress.total}",
            f"cost      {plan.cost.spent:.4f} of {plan.cost.budget:.4f} · {plan.cost.tokens} tokens",
            f"session   {show.id(plan.session_id) if plan.session_id else '-'}",
        ]
        for timing in plan.timings:
            lines.append(
                f"{enum(plan_pb2.PlanPhase, timing.phase):<9} {show.time(timing.start_time)} → "
                f"{show.time(timing.end_time)}"
            )
        if plan.last_error.code:
            lines.append(f"error     {plan.last_error.code}: {show.text(plan.last_error.message)}")
        lines.append("")
        lines.append("x execute · a apply · b rollback · c cancel · o correct (tree) · 1-5 tabs")
        self.query_one("#status-text", Static).update(Text("\n".join(lines)))

    def show_tree(self) -> None:
        tree = self.decisions
        widget: Tree[str] = self.query_one("#decisions", Tree)
        widget.clear()
        if tree is None:
            return
        show = self.acp.show
        widget.root.set_label(
            f"plan {show.id(self.plan_id)}: {len(tree.nodes)} decisions, {len(tree.steps)} steps"
        )
        widget.root.expand()
        steps: dict[str, list[plan_pb2.PlanStep]] = {}
        for step in tree.steps:
            steps.setdefault(step.decision_id, []).append(step)
        placed: dict[str, TreeNode[str]] = {}
        # A large tree opens folded: its decisions one line each, space unfolds one.
        unfold = len(tree.nodes) <= UNFOLDED
        for node in tree.nodes:
            parent = placed.get(node.parent_id, widget.root)
            label = Text()
            if node.superseded:
                label.append("✗ superseded ", style="red")
            label.append(show.text(node.question or node.id))
            if node.choice:
                label.append(f" → {show.text(node.choice)}", style="bold")
            if node.correction:
                label.append(f" (corrected: {show.text(node.correction)})", style="yellow")
            branch = parent.add(label, data=node.id, expand=unfold and not node.superseded)
            placed[node.id] = branch
            self.add_steps(branch, steps.pop(node.id, []))
        if steps:
            loose = widget.root.add("steps", data="", expand=False)
            for group in steps.values():
                self.add_steps(loose, group)

    def add_steps(self, branch: TreeNode[str], steps: list[plan_pb2.PlanStep]) -> None:
        if not steps:
            return
        holder = branch.add(f"{len(steps)} steps", data="", expand=len(steps) <= 20)
        for step in steps[:STEPS_SHOWN]:
            state = enum(plan_pb2.PlanState, step.state)
            holder.add_leaf(Text(f"{step.id} {step.tool} [{state}] {step.description}"), data="")
        if len(steps) > STEPS_SHOWN:
            holder.add_leaf(f"… {len(steps) - STEPS_SHOWN} more steps", data="")

    def show_diff(self) -> None:
        widget = self.query_one("#diff-text", Static)
        if self.diff is None or not self.diff.files:
            widget.update("no changes (the diff appears once the plan has executed)")
            return
        parts: list[RenderableType] = []
        for item in self.diff.files:
            op = enum(plan_pb2.ArtifactOp, item.op)
            parts.append(Text(f"{op} {item.path}", style="bold"))
            parts.append(Syntax(item.unified_diff, "diff", theme="ansi_dark", word_wrap=True))
        widget.update(Group(*parts))

    def on_acp_event(self, event: events_pb2.Event) -> None:
        if event.plan_id == self.plan_id and self._reload_timer is None:
            self._reload_timer = self.set_timer(0.3, self._reload_now)

    def _reload_now(self) -> None:
        self._reload_timer = None
        self.load()

    def reconnected(self) -> None:
        self.load()

    def action_back(self) -> None:
        self.app.pop_screen()

    def action_tab(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab

    def action_copy(self) -> None:
        self.acp.copy_id(self.plan_id, "plan id")

    def action_reload(self) -> None:
        self.load()

    def action_act(self, verb: str) -> None:
        question = {
            "execute": "Execute this plan (strategize and run its steps)?",
            "apply": "Apply this plan: write its artifacts into the project?",
            "rollback": "Roll this plan back: restore the files it changed?",
            "cancel": "Cancel this plan's run?",
        }[verb]

        def answered(yes: bool | None) -> None:
            if yes:
                self.act(verb)

        self.app.push_screen(Confirm(f"{question}\nplan {self.acp.show.id(self.plan_id)}"), answered)

    @work(group="act")
    async def act(self, verb: str) -> None:
        fields: dict[str, Any] = {"plan_id": self.plan_id}
        if verb == "apply" and self.diff is not None and self.diff.digest:
            # Apply what was reviewed: a diff that changed since is refused (docs/plans.md).
            fields["diff_digest"] = self.diff.digest
        done = await self.acp.call(f"plan.{verb}", **fields)
        if done is not None:
            self.notify(f"plan {verb}: done" if verb != "execute" else "plan execute: started")
            self.load()

    def action_correct(self) -> None:
        widget: Tree[str] = self.query_one("#decisions", Tree)
        node = widget.cursor_node
        if node is None or not node.data:
            self.action_tab("tree")
            self.notify("choose a decision in the tree (2), then o", severity="warning")
            return
        node_id = node.data

        def answered(text: str | None) -> None:
            if text:
                self.correct(node_id, text)

        self.app.push_screen(Ask(f"Correction at decision {self.acp.show.id(node_id)}:"), answered)

    @work(group="act")
    async def correct(self, node_id: str, text: str) -> None:
        def confirmed(yes: bool | None) -> None:
            if yes:
                self.send_correction(node_id, text)

        self.app.push_screen(
            Confirm(f"Correct the plan at this decision and re-strategize from it?\n{text}"), confirmed
        )

    @work(group="act")
    async def send_correction(self, node_id: str, text: str) -> None:
        done = await self.acp.call("plan.correct", plan_id=self.plan_id, node_id=node_id, text=text)
        if done is not None:
            self.notify("plan corrected")
            self.load()
