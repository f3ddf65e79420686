"""The Zed ACP agent ``agents editor`` runs: each Zed ACP method is a few ACP operations
through ``ACPClient`` (any transport), and every session is one of ours, stored on the
server: the bridge holds nothing a restart would lose (only the prompts running now and
caches of what the server says).

| Zed ACP | ACP |
| --- | --- |
| ``initialize`` | (capabilities; the token of ``--token``/``ACP_TOKEN``/the profile as auth method) |
| ``authenticate`` | ``session.list`` (the token works) |
| ``session/new {cwd}`` | ``project.resolve {path: cwd}``, ``session.create`` |
| ``session/load`` | ``session.show`` (paged), ``plan.status/tree/artifacts/diff`` |
| ``session/list`` | ``project.resolve``, ``session.list`` |
| ``session/prompt`` | ``session.tell`` (background), ``events.subscribe``, ``approval.list/answer`` |
| ``session/cancel`` | ``session.cancel_turn`` (with its plans) |
| ``session/set_mode`` | ``session.update`` (``automation_profile``) |
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import sys
from importlib import metadata
from typing import Any

from acp import PROTOCOL_VERSION, RequestError, helpers
from acp.interfaces import Client
from acp.schema import (
    AgentCapabilities,
    AuthenticateResponse,
    AuthMethodAgent,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptCapabilities,
    PromptResponse,
    SessionCapabilities,
    SessionInfo,
    SessionListCapabilities,
    SetSessionModeResponse,
)

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.editor import modes
from cleveragents.acp.client.editor.errors import translated
from cleveragents.acp.client.editor.history import replay
from cleveragents.acp.client.editor.permissions import Permissions, ServerApprovals
from cleveragents.acp.client.editor.turns import PromptTurn
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import session_pb2

AUTH_METHOD = "acp-token"
LIST_PAGE_SIZE = 50
# Session labels that say where a session began (``agents session list --labels`` finds them).
LABELS = {"client": "zed-acp"}


def _version() -> str:
    try:
        return metadata.version("cleveragents-acp")
    except metadata.PackageNotFoundError:
        return "0"


class EditorAgent:
    """A Zed ACP ``Agent`` over ``ACPClient``."""

    def __init__(
        self, client: ACPClient, where: str, permissions: Permissions | None = None, *, orchestrator: str = ""
    ) -> None:
        self.client = client
        # The orchestrator actor of new sessions ("": the built-in one).
        self.orchestrator = orchestrator
        self.where = where
        self._permissions = permissions
        self._editor: Client | None = None
        self._prompts: dict[str, PromptTurn] = {}
        self._folders: dict[tuple[str, str], dict[str, str]] = {}
        self._actions: dict[str, set[str]] = {}
        # Sessions read before (their namespace and orchestrator do not change).
        self._known: dict[str, session_pb2.Session] = {}
        # Per session, the last event sequence a prompt read (the next one reads after it).
        self._seen: dict[str, int] = {}
        self._background: set[asyncio.Task[Any]] = set()

    # connection ------------------------------------------------------------------------

    def on_connect(self, conn: Client) -> None:
        self._editor = conn
        if self._permissions is None:
            self._permissions = ServerApprovals(self.client, conn)

    @property
    def editor(self) -> Client:
        if self._editor is None:
            raise RequestError.internal_error({"details": "no client connection"})
        return self._editor

    @property
    def permissions(self) -> Permissions:
        if self._permissions is None:
            raise RequestError.internal_error({"details": "no client connection"})
        return self._permissions

    # initialize and authenticate -------------------------------------------------------

    async def initialize(
        self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None, **kwargs: Any
    ) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(embedded_context=True),
                session_capabilities=SessionCapabilities(list=SessionListCapabilities()),
            ),
            auth_methods=[
                AuthMethodAgent(
                    id=AUTH_METHOD,
                    name="CleverAgents ACP token",
                    description="The token agents editor was given (--token, ACP_TOKEN or the config "
                    "profile's token); local mode needs none.",
                )
            ],
            agent_info=Implementation(
                name="cleveragents-acp", title="CleverAgents (agents editor)", version=_version()
            ),
        )

    async def authenticate(self, method_id: str, **kwargs: Any) -> AuthenticateResponse:
        if method_id != AUTH_METHOD:
            raise _invalid(-32602, f"unknown auth method {method_id!r}; the one offered is {AUTH_METHOD!r}")
        with translated(self.where):
            await self.client.call("session.list", page_size=1)
        return AuthenticateResponse()

    # sessions --------------------------------------------------------------------------

    async def _resolve(self, cwd: str) -> Any:
        with translated(self.where):
            return await self.client.call("project.resolve", path=cwd)

    async def new_session(self, cwd: str, mcp_servers: Any = None, **kwargs: Any) -> NewSessionResponse:
        found = await self._resolve(cwd)
        project = found.project
        namespace = project.meta.namespace
        with translated(self.where):
            await modes.ensure_profile(self.client, namespace, modes.DEFAULT)
            created = await self.client.call(
                "session.create",
                namespace=namespace,
                project=project.name,
                orchestrator=self.orchestrator,
                title=f"{posixpath.basename(cwd.rstrip('/')) or cwd} (editor)",
                labels=LABELS,
                automation_profile=modes.DEFAULT.profile,
            )
        session: session_pb2.Session = created.session  # type: ignore[attr-defined]
        self._later(self._advertise(session))
        return NewSessionResponse(session_id=session.meta.id, modes=modes.state(session.automation_profile))

    async def load_session(
        self, cwd: str, session_id: str, mcp_servers: Any = None, **kwargs: Any
    ) -> LoadSessionResponse:
        session = await self._session(session_id)
        with translated(self.where):
            await replay(self.client, self.editor, session, self.folders)
        self._later(self._advertise(session))
        return LoadSessionResponse(modes=modes.state(session.automation_profile))

    async def list_sessions(
        self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any
    ) -> ListSessionsResponse:
        fields: dict[str, Any] = {"page_size": LIST_PAGE_SIZE, "page_token": cursor or ""}
        if cwd:
            found = await self._resolve(cwd)
            fields.update(project=found.project.name, namespace=found.project.meta.namespace)
        with translated(self.where):
            page = await self.client.call("session.list", **fields)
            infos = []
            for session in page.sessions:  # type: ignore[attr-defined]
                folder = cwd or await self._folder(session)
                infos.append(
                    SessionInfo(
                        session_id=session.meta.id,
                        cwd=folder,
                        title=session.title or None,
                        updated_at=session.meta.update_time.ToJsonString()
                        if session.meta.HasField("update_time")
                        else None,
                    )
                )
        return ListSessionsResponse(sessions=infos, next_cursor=page.next_page_token or None)  # type: ignore[attr-defined]

    async def set_session_mode(self, mode_id: str, session_id: str, **kwargs: Any) -> SetSessionModeResponse:
        mode = modes.BY_ID.get(mode_id)
        if mode is None:
            raise _invalid(-32602, f"unknown mode {mode_id!r}; the modes are {', '.join(modes.BY_ID)}")
        session = await self._session(session_id)
        with translated(self.where):
            await modes.ensure_profile(self.client, session.meta.namespace, mode)
            await self.client.call(
                "session.update",
                session_id=session_id,
                session={"automation_profile": mode.profile},
                update_mask="automationProfile",
            )
        self._later(self.editor.session_update(session_id, helpers.update_current_mode(mode.id)))
        return SetSessionModeResponse()

    # prompts ---------------------------------------------------------------------------

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        if session_id in self._prompts:
            raise _invalid(-32600, f"session {session_id} already has a prompt running")
        text = prompt_text(prompt)
        if text.startswith("/"):
            # Only a slash command needs the session first (its namespace's actions); plain
            # text goes straight to the tell, which checks the session itself.
            session = self._known.get(session_id) or await self._session(session_id)
            text = modes.as_orchestrator_text(text, await self._action_names(session))
        if not text.strip():
            raise _invalid(-32602, "the prompt has no text")
        turn = PromptTurn(
            self.client,
            self.editor,
            self.permissions,
            self.folders,
            session_id,
            lambda: self._session(session_id),
        )
        self._prompts[session_id] = turn
        try:
            with translated(self.where):
                stop = await turn.run(text)
        finally:
            self._prompts.pop(session_id, None)
        return PromptResponse(stop_reason=stop)  # type: ignore[arg-type]

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        turn = self._prompts.get(session_id)
        if turn is not None:
            await turn.cancel()

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        raise RequestError.method_not_found(method)

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        return None

    # helpers ---------------------------------------------------------------------------

    async def _session(self, session_id: str) -> session_pb2.Session:
        with translated(self.where):
            shown = await self.client.call("session.show", session_id=session_id, page_size=1)
        session: session_pb2.Session = shown.session  # type: ignore[attr-defined]
        self._known[session_id] = session
        return session

    async def folders(self, namespace: str, project: str) -> dict[str, str]:
        """A project's resources and their folders (cached: paths of resources rarely move)."""
        key = (namespace, project)
        if key not in self._folders and project:
            found: dict[str, str] = {}
            shown = await self.client.call("project.show", namespace=namespace, name=project)
            for name in shown.project.spec.resources:  # type: ignore[attr-defined]
                with contextlib.suppress(ACPError):
                    resource = await self.client.call("resource.show", namespace=namespace, name=name)
                    if resource.resource.spec.path:  # type: ignore[attr-defined]
                        found[name] = resource.resource.spec.path  # type: ignore[attr-defined]
            self._folders[key] = found
        return self._folders.get(key, {})

    async def _folder(self, session: session_pb2.Session) -> str:
        with contextlib.suppress(ACPError):
            folders = await self.folders(session.meta.namespace, session.project)
            if folders:
                return next(iter(folders.values()))
        return "/"

    async def _action_names(self, session: session_pb2.Session) -> set[str]:
        if session.meta.namespace not in self._actions:
            with translated(self.where):
                listed = await modes.commands(self.client, session.meta.namespace, session.orchestrator)
            self._actions[session.meta.namespace] = {
                c.name for c in listed if c.name not in {name for name, _, _ in modes.ORCHESTRATOR_COMMANDS}
            }
        return self._actions[session.meta.namespace]

    async def _advertise(self, session: session_pb2.Session) -> None:
        listed = await modes.commands(self.client, session.meta.namespace, session.orchestrator)
        self._actions[session.meta.namespace] = {
            c.name for c in listed if c.name not in {name for name, _, _ in modes.ORCHESTRATOR_COMMANDS}
        }
        await self.editor.session_update(session.meta.id, helpers.update_available_commands(listed))

    def _later(self, work: Any) -> None:
        """Work that follows the answer (a notification the client reads once it knows the
        session); its failure is a line on stderr."""

        async def run() -> None:
            try:
                await work
            except Exception as exc:  # reported, never raised into the connection
                sys.stderr.write(f"agents editor: {exc!r}\n")

        task = asyncio.create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)


def prompt_text(blocks: list[Any]) -> str:
    """The prompt's text: text blocks as written, a linked resource as its URI, an embedded
    one as its text under its URI; images and audio are left out (said on stderr)."""
    parts: list[str] = []
    for block in blocks:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource_link":
            parts.append(block.uri)
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            parts.append(f"{resource.uri}:\n{text}" if text is not None else resource.uri)
        else:
            sys.stderr.write(f"agents editor: a {kind or 'content'} block of the prompt is left out\n")
    return "\n".join(parts)


def _invalid(code: int, message: str) -> RequestError:
    """A JSON-RPC error whose message says what was wrong (editors show the message)."""
    return RequestError(code, message, {"details": message})
