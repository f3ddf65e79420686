"""The handlers of ACP 2's operations, and how a process's handler tables get them.

``session.show`` of ACP 2 is ACP 1's, reshaped: the same domain call (through ACP 1's
handler), the latest message and the count instead of the whole history. ``session.count``
exists only in ACP 2 (the CLI's commands include it).
``events.subscribe`` of ACP 2 is ACP 1's stream as it is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any

from google.protobuf import message

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.catalog import Catalog
from cleveragents.acp.facade.handlers import table
from cleveragents.acp.facade.handlers.events import EventHandlers
from cleveragents.acp.facade.handlers.sessions import SessionHandlers
from cleveragents.acp.facade.handlers.table import Handler, handles
from cleveragents.acp.v1 import session_pb2 as v1
from tests.proto_v2 import contract


class SessionHandlersV2:
    def __init__(self, v1_sessions: SessionHandlers) -> None:
        self._v1 = v1_sessions

    @handles("session.show", major=2)
    async def GetSession(self, request: Any, ctx: CallContext) -> message.Message:
        shown = await self._v1.GetSession(v1.GetSessionRequest(session_id=request.session_id), ctx)
        response: message.Message = contract.session_pb2().GetSessionResponse(
            session=shown.session,
            latest_message=shown.messages[-1] if shown.messages else None,
            message_count=len(shown.messages),
        )
        return response

    @handles("session.count", major=2)
    async def CountMessages(self, request: Any, ctx: CallContext) -> message.Message:
        shown = await self._v1.GetSession(v1.GetSessionRequest(session_id=request.session_id), ctx)
        counted: message.Message = contract.session_pb2().CountMessagesResponse(
            message_count=len(shown.messages)
        )
        return counted


class EventHandlersV2:
    def __init__(self, v1_events: EventHandlers) -> None:
        self._v1 = v1_events

    @handles("events.subscribe", major=2)
    def SubscribeEvents(self, request: Any, ctx: CallContext) -> AsyncIterator[message.Message]:
        return self._v1.SubscribeEvents(request, ctx)


def with_v2(groups: Iterable[object]) -> list[object]:
    """``groups`` and the ACP 2 groups over the ACP 1 handlers among them."""
    groups = list(groups)
    sessions = next(group for group in groups if isinstance(group, SessionHandlers))
    events = next(group for group in groups if isinstance(group, EventHandlers))
    return [*groups, SessionHandlersV2(sessions), EventHandlersV2(events)]


def serve_v2(
    build: Callable[..., Mapping[str, Handler]], contract: Catalog | None = None
) -> Callable[..., Mapping[str, Handler]]:
    """``table.build`` that adds the ACP 2 group whenever it builds the full table, checked
    against ``contract`` (default: the process's catalog, which then holds ACP 2)."""

    def build_with_v2(groups: Iterable[object], **kwargs: Any) -> Mapping[str, Handler]:
        groups = list(groups)
        if kwargs.get("serves") is None and any(isinstance(g, SessionHandlers) for g in groups):
            groups = with_v2(groups)
            if contract is not None:
                kwargs["contract"] = contract
        return build(groups, **kwargs)

    return build_with_v2


def install_handlers() -> None:
    """Every handler table the factory builds in this process serves ACP 2 too (a real
    major would list its groups in ``facade/factory.py``)."""
    if not getattr(table.build, "serves_v2", False):
        patched = serve_v2(table.build)
        patched.serves_v2 = True  # type: ignore[attr-defined]
        table.build = patched
