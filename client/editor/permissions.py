"""Asking the person before a staged plan is applied (Zed ACP ``session/request_permission``).

The one seam between the bridge and approvals. Until the server stores approval requests
(the approvals work: ``approval.*`` operations and events), ``ApplyGate`` asks here, in the
bridge, for a plan of an ``ask`` session that ran and staged its changes: the request's
content is the diff, its four options the Zed ACP option kinds, and an allow applies with
``plan.apply`` bound to the digest of exactly that diff (``diff_digest``), so a change staged
since is refused rather than applied. Once approval requests exist, a class answering the
same ``Permissions`` protocol maps each request of the session's plans to
``session/request_permission`` and its answer to ``approval.answer``.

Fail closed: a client that does not support the method, answers with an error, cancels or
goes away leaves the plan staged. Nothing is ever allowed without the person.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Protocol

from acp import helpers
from acp.interfaces import Client
from acp.schema import AllowedOutcome, PermissionOption, ToolCallUpdate

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.editor import modes
from cleveragents.acp.client.editor.plans import PlanView
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import plan_pb2

OPTIONS = (
    PermissionOption(option_id="apply", name="Apply", kind="allow_once"),
    PermissionOption(
        option_id="apply-always", name="Apply, and apply from now on (mode auto)", kind="allow_always"
    ),
    PermissionOption(option_id="keep-staged", name="Keep staged", kind="reject_once"),
    PermissionOption(
        option_id="never-apply", name="Keep staged from now on (mode stage)", kind="reject_always"
    ),
)


@dataclass(frozen=True)
class Decision:
    applied: bool
    # What to tell the person (why it was not applied, or what was).
    note: str
    # The mode the answer switched the session to, if any.
    mode: modes.Mode | None = None


class Permissions(Protocol):
    async def settle(self, session_id: str, view: PlanView, mode: modes.Mode) -> Decision | None:
        """Once a plan's run has ended: what the person decided about it (None: nothing to ask)."""
        ...


class ApplyGate:
    def __init__(self, client: ACPClient, editor: Client) -> None:
        self.client = client
        self.editor = editor

    async def settle(self, session_id: str, view: PlanView, mode: modes.Mode) -> Decision | None:
        plan = view.plan
        staged = plan.phase == plan_pb2.PLAN_PHASE_EXECUTE and plan.state == plan_pb2.PLAN_STATE_SUCCEEDED
        if not staged or not mode.asks or not view.diff.files:
            return None
        call_id = view.call_id("apply")
        title = f"Apply plan {plan.meta.id} ({plan.action}) to project {plan.project}"
        content = view.all_diffs()
        await self.editor.session_update(
            session_id,
            helpers.start_tool_call(call_id, title, kind="edit", status="pending", content=content),
        )
        chosen = await self._ask(session_id, call_id, title, content)
        if chosen in ("apply", "apply-always"):
            switched = modes.BY_ID["auto"] if chosen == "apply-always" else None
            if switched is not None:
                await _switch(self.client, session_id, plan.meta.namespace, switched)
            applied = await self.client.call("plan.apply", plan_id=plan.meta.id, diff_digest=view.diff.digest)
            paths = ", ".join(applied.changed_paths)  # type: ignore[attr-defined]
            await self.editor.session_update(
                session_id, helpers.update_tool_call(call_id, status="completed")
            )
            return Decision(True, f"Applied plan {plan.meta.id}: {paths}.", switched)
        switched = modes.BY_ID["stage"] if chosen == "never-apply" else None
        if switched is not None:
            await _switch(self.client, session_id, plan.meta.namespace, switched)
        await self.editor.session_update(session_id, helpers.update_tool_call(call_id, status="failed"))
        why = "you kept it staged" if chosen else "no permission was given"
        return Decision(
            False,
            f"Plan {plan.meta.id} is staged ({why}); `agents plan apply {plan.meta.id}` applies it.",
            switched,
        )

    async def _ask(self, session_id: str, call_id: str, title: str, content: list[Any]) -> str | None:
        """The chosen option's id; None when the client could not or did not answer."""
        update = ToolCallUpdate(
            tool_call_id=call_id, title=title, kind="edit", status="pending", content=content
        )
        try:
            answer = await self.editor.request_permission(
                session_id=session_id, tool_call=update, options=list(OPTIONS)
            )
        except Exception as exc:  # any failure of the client is a refusal
            sys.stderr.write(
                f"agents editor: permission request not answered ({exc!r}); the plan stays staged\n"
            )
            return None
        outcome = answer.outcome
        return outcome.option_id if isinstance(outcome, AllowedOutcome) else None


async def _switch(client: ACPClient, session_id: str, namespace: str, mode: modes.Mode) -> None:
    try:
        await modes.ensure_profile(client, namespace, mode)
        await client.call(
            "session.update",
            session_id=session_id,
            session={"automation_profile": mode.profile},
            update_mask="automationProfile",
        )
    except ACPError as exc:
        sys.stderr.write(
            f"agents editor: could not switch the session to mode {mode.id}: {exc.code}: {exc.message}\n"
        )
