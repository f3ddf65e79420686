"""session.*: handlers over the ``Sessions`` domain service."""

from __future__ import annotations

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.facade.domain.sessions.service import Sessions
from cleveragents.acp.facade.handlers.table import handles
from cleveragents.acp.v1 import session_pb2


class SessionHandlers:
    def __init__(self, sessions: Sessions) -> None:
        self._sessions = sessions

    @handles("session.create")
    async def CreateSession(
        self, request: session_pb2.CreateSessionRequest, ctx: CallContext
    ) -> session_pb2.CreateSessionResponse:
        return await self._sessions.create(ctx, request)

    @handles("session.resume")
    async def ResumeSession(
        self, request: session_pb2.ResumeSessionRequest, ctx: CallContext
    ) -> session_pb2.ResumeSessionResponse:
        return session_pb2.ResumeSessionResponse(session=await self._sessions.resume(ctx, request.session_id))

    @handles("session.list")
    async def ListSessions(
        self, request: session_pb2.ListSessionsRequest, ctx: CallContext
    ) -> session_pb2.ListSessionsResponse:
        return await self._sessions.list_sessions(ctx, request)

    @handles("session.show")
    async def GetSession(
        self, request: session_pb2.GetSessionRequest, ctx: CallContext
    ) -> session_pb2.GetSessionResponse:
        return await self._sessions.show(ctx, request)

    @handles("session.delete")
    async def DeleteSession(
        self, request: session_pb2.DeleteSessionRequest, ctx: CallContext
    ) -> session_pb2.DeleteSessionResponse:
        await self._sessions.delete(ctx, request.session_id)
        return session_pb2.DeleteSessionResponse(session_id=request.session_id)

    @handles("session.export")
    async def ExportSession(
        self, request: session_pb2.ExportSessionRequest, ctx: CallContext
    ) -> session_pb2.ExportSessionResponse:
        return await self._sessions.export(ctx, request.session_id)

    @handles("session.import")
    async def ImportSession(
        self, request: session_pb2.ImportSessionRequest, ctx: CallContext
    ) -> session_pb2.ImportSessionResponse:
        return session_pb2.ImportSessionResponse(session=await self._sessions.import_(ctx, request))

    @handles("session.tell")
    async def TellSession(
        self, request: session_pb2.TellSessionRequest, ctx: CallContext
    ) -> session_pb2.TellSessionResponse:
        return await self._sessions.tell(ctx, request)

    @handles("session.turn")
    async def GetTurn(
        self, request: session_pb2.GetTurnRequest, ctx: CallContext
    ) -> session_pb2.GetTurnResponse:
        return await self._sessions.get_turn(ctx, request)

    @handles("session.cancel_turn")
    async def CancelTurn(
        self, request: session_pb2.CancelTurnRequest, ctx: CallContext
    ) -> session_pb2.CancelTurnResponse:
        return await self._sessions.cancel_turn(ctx, request)

    @handles("session.update")
    async def UpdateSession(
        self, request: session_pb2.UpdateSessionRequest, ctx: CallContext
    ) -> session_pb2.UpdateSessionResponse:
        return await self._sessions.update(ctx, request)
