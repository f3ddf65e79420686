"""Zed ACP session modes and slash commands, in terms of our sessions.

A mode is the session's automation override (``session.update`` of ``automation_profile``,
ACP 1.3): each names an automation profile of the namespace, made on first use.

| mode | profile | what a plan the session starts does |
| --- | --- | --- |
| ``ask`` | ``editor-ask`` | runs; its apply asks the person first (approval policy ``ask: [apply]``) |
| ``auto`` | ``editor-auto`` | runs and applies |
| ``stage`` | ``editor-stage`` | runs and stays staged (``agents plan apply`` applies it) |

A session whose profile is none of these (made elsewhere) shows its own as a fourth mode.

Slash commands: the built-in orchestrator's own (``/help``, ``/actions``, ``/use``, ``/close``,
docs/sessions.md) and one per action of the namespace (``/hello name=Ada`` is sent as
``/use hello name=Ada``); a model orchestrator takes plain text, so it gets none.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from acp.schema import (
    AvailableCommand,
    AvailableCommandInput,
    SessionMode,
    SessionModeState,
    UnstructuredCommandInput,
)

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.contract.errors import ACPError


@dataclass(frozen=True)
class Mode:
    id: str
    profile: str
    name: str
    description: str
    spec: dict[str, Any]


MODES = (
    Mode(
        "ask",
        "editor-ask",
        "Ask",
        "Plans run; applying their changes waits for your permission.",
        # The server asks (docs/approvals.md): the apply pauses for an approval request.
        {"auto_execute": True, "auto_apply": True, "approval": {"ask": ["apply"]}},
    ),
    Mode(
        "auto",
        "editor-auto",
        "Auto",
        "Plans run and apply their changes.",
        {"auto_execute": True, "auto_apply": True},
    ),
    Mode(
        "stage",
        "editor-stage",
        "Stage",
        "Plans run and stay staged; nothing is applied from here.",
        {"auto_execute": True, "auto_apply": False},
    ),
)
BY_ID = {mode.id: mode for mode in MODES}
BY_PROFILE = {mode.profile: mode for mode in MODES}
DEFAULT = MODES[0]

# The built-in orchestrator's commands (facade/domain/orchestrators/builtin.py, docs/sessions.md).
ORCHESTRATOR_COMMANDS = (
    ("help", "What the orchestrator can do", None),
    ("actions", "The actions of this namespace", None),
    ("use", "Start a plan from an action", "<action> key=value ..."),
    ("close", "Close this session (session.resume reopens it)", None),
)


def mode_of(profile: str) -> str:
    mode = BY_PROFILE.get(profile)
    return mode.id if mode is not None else (f"profile:{profile}" if profile else "action")


def state(profile: str) -> SessionModeState:
    modes = [SessionMode(id=m.id, name=m.name, description=m.description) for m in MODES]
    current = mode_of(profile)
    if current not in BY_ID:
        own = f"the automation profile {profile!r}" if profile else "each action's own automation profile"
        modes.append(
            SessionMode(id=current, name=profile or "Action's own", description=f"Plans follow {own}.")
        )
    return SessionModeState(current_mode_id=current, available_modes=modes)


async def ensure_profile(client: ACPClient, namespace: str, mode: Mode) -> None:
    """The mode's automation profile exists in the namespace (made now if it does not)."""
    try:
        shown = await client.call("automation_profile.show", namespace=namespace, name=mode.profile)
    except ACPError as exc:
        if exc.code != "NOT_FOUND":
            raise
    else:
        profile = shown.automation_profile  # type: ignore[attr-defined]
        wanted = list(mode.spec.get("approval", {}).get("ask", []))
        if list(profile.spec.approval.ask) != wanted or profile.spec.auto_apply != mode.spec["auto_apply"]:
            # Made by an earlier bridge (before server approvals): brought to the mode's spec.
            try:
                await client.call(
                    "automation_profile.update",
                    namespace=namespace,
                    name=mode.profile,
                    revision=profile.revision,
                    spec=mode.spec,
                    update_mask="spec",
                )
            except ACPError as exc:
                sys.stderr.write(
                    f"agents editor: could not update the profile {mode.profile}: {exc.code}: {exc.message}\n"
                )
        return
    try:
        await client.call(
            "automation_profile.add",
            namespace=namespace,
            name=mode.profile,
            description=f"Zed ACP editor mode {mode.id!r} (agents editor): {mode.description}",
            spec=mode.spec,
        )
    except ACPError as exc:
        if exc.code != "ALREADY_EXISTS":
            raise


async def commands(client: ACPClient, namespace: str, orchestrator: str) -> list[AvailableCommand]:
    actor = await client.call("actor.show", namespace=namespace, name=orchestrator)
    if actor.actor.spec.provider != "orchestrator":  # type: ignore[attr-defined]
        return []
    found = [
        AvailableCommand(
            name=name,
            description=text,
            input=AvailableCommandInput(root=UnstructuredCommandInput(hint=hint)) if hint else None,
        )
        for name, text, hint in ORCHESTRATOR_COMMANDS
    ]
    reserved = {name for name, _, _ in ORCHESTRATOR_COMMANDS}
    token = ""
    for _ in range(20):
        page = await client.call("action.list", namespace=namespace, page_size=500, page_token=token)
        for action in page.actions:  # type: ignore[attr-defined]
            if action.name not in reserved:
                found.append(
                    AvailableCommand(
                        name=action.name,
                        description=action.description or f"Start a plan from the action {action.name!r}",
                        input=AvailableCommandInput(root=UnstructuredCommandInput(hint="key=value ...")),
                    )
                )
        token = page.next_page_token  # type: ignore[attr-defined]
        if not token:
            break
    return found


def as_orchestrator_text(text: str, actions: set[str]) -> str:
    """``/<action> args`` becomes ``/use <action> args``; anything else is sent as typed."""
    if not text.startswith("/"):
        return text
    word, _, rest = text[1:].partition(" ")
    if word in actions:
        return f"/use {word} {rest}".rstrip()
    return text
