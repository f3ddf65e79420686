"""``session/load``: a stored session's whole history as ``session/update`` notifications,
in order: the user's messages as ``user_message_chunk``, the orchestrator's as
``agent_message_chunk``, and after the message that started a plan, the plan as it stands
(its ``plan`` and a tool call per step, with the diff of what each staged)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from acp import helpers
from acp.interfaces import Client

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.editor.plans import PlanView
from cleveragents.acp.client.editor.turns import outcome
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import session_pb2

PAGE_SIZE = 500
Folders = Callable[[str, str], Awaitable[dict[str, str]]]


async def replay(client: ACPClient, editor: Client, session: session_pb2.Session, folders: Folders) -> None:
    session_id = session.meta.id
    token = ""
    shown: set[str] = set()
    while True:
        page = await client.call("session.show", session_id=session_id, page_size=PAGE_SIZE, page_token=token)
        for message in page.messages:  # type: ignore[attr-defined]
            text = message.content if message.content.endswith("\n") else message.content + "\n"
            if message.role == session_pb2.MESSAGE_ROLE_USER:
                await editor.session_update(session_id, helpers.update_user_message_text(text))
            else:
                await editor.session_update(session_id, helpers.update_agent_message_text(text))
            if message.plan_id and message.plan_id not in shown:
                shown.add(message.plan_id)
                await _plan(client, editor, session_id, message.plan_id, folders)
        token = page.next_page_token  # type: ignore[attr-defined]
        if not token:
            return


async def _plan(client: ACPClient, editor: Client, session_id: str, plan_id: str, folders: Folders) -> None:
    view = PlanView(client, plan_id, {})
    try:
        status = await client.call("plan.status", plan_id=plan_id)
        plan = status.plan  # type: ignore[attr-defined]
        view.folders = await folders(plan.meta.namespace, plan.project)
        for update in await view.refresh():
            await editor.session_update(session_id, update)
    except ACPError as exc:
        # A plan removed since, or one the caller may not read, leaves a line, not a hole.
        await editor.session_update(
            session_id, helpers.update_agent_message_text(f"(plan {plan_id}: {exc.code}: {exc.message})\n")
        )
        return
    await editor.session_update(session_id, helpers.update_agent_message_text(outcome(view.plan) + "\n"))
