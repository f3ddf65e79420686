"""Asking the person what a plan's approval request asks (Zed ACP ``session/request_permission``).

The server stores approval requests (docs/approvals.md): mode ``ask`` is an automation
profile whose approval policy asks before the apply, so a plan of such a session pauses in
``awaiting_approval`` with a request bound to the digest of exactly the diff it would write.
``ServerApprovals`` turns each pending request of a plan the prompt follows into
``session/request_permission``: its content is the diff (an apply) or the tool and its
arguments, or the command line (a step); its four options are the Zed ACP option kinds, each
one of the four answers. The chosen option is sent as ``approval.answer`` carrying the
request's ``digest``, so a change staged since is refused rather than allowed unseen; the
server then resumes the plan (applies it, or runs the step).

Fail closed: a client that does not support the method, answers with an error, answers
``cancelled`` (``session/cancel``) or goes away leaves the request pending, its plan waiting:
nothing is ever allowed without the person, and any client (CLI, console) may answer later.
"""

from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass
from typing import Any, Protocol

from acp import helpers
from acp.interfaces import Client
from acp.schema import AllowedOutcome, PermissionOption, ToolCallUpdate
from google.protobuf import json_format

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.editor import modes
from cleveragents.acp.client.editor.plans import PlanView, tool_kind
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import approval_pb2

OPTIONS = (
    PermissionOption(option_id="allow", name="Allow", kind="allow_once"),
    PermissionOption(
        option_id="allow-always", name="Allow, and from now on (mode auto)", kind="allow_always"
    ),
    PermissionOption(option_id="reject", name="Reject", kind="reject_once"),
    PermissionOption(
        option_id="reject-always", name="Reject, and from now on (mode stage)", kind="reject_always"
    ),
)
# Each option's answer, and the mode the session switches to with it (None: it stays).
ANSWERS: dict[str, tuple[int, str | None]] = {
    "allow": (approval_pb2.APPROVAL_ANSWER_ALLOW_ONCE, None),
    "allow-always": (approval_pb2.APPROVAL_ANSWER_ALLOW_ALWAYS, "auto"),
    "reject": (approval_pb2.APPROVAL_ANSWER_REJECT_ONCE, None),
    "reject-always": (approval_pb2.APPROVAL_ANSWER_REJECT_ALWAYS, "stage"),
}


@dataclass(frozen=True)
class Decision:
    # The request as stored after the answer (None: no answer was given; it stays pending).
    approval: approval_pb2.Approval | None
    # What to tell the person.
    note: str
    # The mode the answer switched the session to, if any.
    mode: modes.Mode | None = None

    @property
    def allowed(self) -> bool:
        return self.approval is not None and self.approval.state == approval_pb2.APPROVAL_STATE_ALLOWED


class Permissions(Protocol):
    async def ask(self, session_id: str, view: PlanView) -> Decision | None:
        """A plan awaits approval: ask the person its pending request (None: none is pending)."""
        ...


def content(approval: approval_pb2.Approval, view: PlanView) -> list[Any]:
    """What the request asks about: the diff of an apply, the command line or the tool and
    arguments of a step."""
    if approval.kind == "apply":
        if view.diff.digest == approval.digest:
            shown = view.all_diffs()
            if shown:
                return shown
        return [helpers.tool_content(helpers.text_block(approval.diff))]
    if approval.command:
        text = f"$ {shlex.join(approval.command)}"
    else:
        args = json.dumps(json_format.MessageToDict(approval.args), indent=2, sort_keys=True)
        text = f"{approval.tool} {args}"
    return [helpers.tool_content(helpers.text_block(text))]


class ServerApprovals:
    def __init__(self, client: ACPClient, editor: Client) -> None:
        self.client = client
        self.editor = editor

    async def ask(self, session_id: str, view: PlanView) -> Decision | None:
        plan = view.plan
        listed = await self.client.call(
            "approval.list", plan_id=plan.meta.id, state=approval_pb2.APPROVAL_STATE_PENDING
        )
        pending: list[approval_pb2.Approval] = list(listed.approvals)  # type: ignore[attr-defined]
        if not pending:
            return None
        approval = pending[0]
        shown = content(approval, view)
        if approval.kind == "apply":
            call_id = view.call_id("apply")
            title = f"Apply plan {plan.meta.id} ({plan.action}) to project {plan.project}"
            kind: Any = "edit"
            await self.editor.session_update(
                session_id,
                helpers.start_tool_call(call_id, title, kind=kind, status="pending", content=shown),
            )
        else:
            call_id = view.call_id(approval.step_id)
            title = f"Run {approval.tool} (plan {plan.meta.id}, step {approval.step_id})"
            kind = tool_kind(approval.tool)
        chosen = await self._request(session_id, call_id, title, kind, shown)
        if chosen not in ANSWERS:
            waiting = (
                f"Plan {plan.meta.id} waits for approval {approval.id} (no answer was given): "
                f"`agents approval answer {approval.id} --answer allow_once` allows it."
            )
            return Decision(None, waiting)
        answer, mode_id = ANSWERS[chosen]
        switched = modes.BY_ID[mode_id] if mode_id else None
        if switched is not None:
            await _switch(self.client, session_id, plan.meta.namespace, switched)
        answered = await self.client.call(
            "approval.answer",
            approval_id=approval.id,
            answer=answer,
            digest=approval.digest,
            reason="answered in the editor (Zed ACP session/request_permission)",
        )
        stored: approval_pb2.Approval = answered.approval  # type: ignore[attr-defined]
        allowed = stored.state == approval_pb2.APPROVAL_STATE_ALLOWED
        if approval.kind == "apply":
            await self.editor.session_update(
                session_id, helpers.update_tool_call(call_id, status="in_progress" if allowed else "failed")
            )
        if allowed:
            note = f"Allowed {approval.kind} of plan {plan.meta.id}."
        elif approval.kind == "apply":
            pid = plan.meta.id
            note = f"Plan {pid} is staged (you rejected it); `agents plan apply {pid}` applies it."
        else:
            note = f"Rejected step {approval.step_id} of plan {plan.meta.id}."
        return Decision(stored, note, switched)

    async def _request(
        self, session_id: str, call_id: str, title: str, kind: Any, shown: list[Any]
    ) -> str | None:
        """The chosen option's id; None when the client could not or did not answer."""
        update = ToolCallUpdate(tool_call_id=call_id, title=title, kind=kind, status="pending", content=shown)
        try:
            answer = await self.editor.request_permission(
                session_id=session_id, tool_call=update, options=list(OPTIONS)
            )
        except Exception as exc:  # any failure of the client leaves the request pending
            sys.stderr.write(
                f"agents editor: permission request not answered ({exc!r}); the approval stays pending\n"
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
