"""session.*: the SessionService servicer over the ``Sessions`` domain service."""

from __future__ import annotations

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.facade.domain.sessions import Sessions
from cleveragents.acp.v1 import session_pb2, session_pb2_grpc


class SessionFacade(session_pb2_grpc.SessionServiceServicer):
    def __init__(self, sessions: Sessions) -> None:
        self._sessions = sessions

    async def CreateSession(
        self, request: session_pb2.CreateSessionRequest, context: object
    ) -> session_pb2.CreateSessionResponse:
        session = self._sessions.create(CallContext.of(context), request)
        return session_pb2.CreateSessionResponse(session=session)

    async def ResumeSession(
        self, request: session_pb2.ResumeSessionRequest, context: object
    ) -> session_pb2.ResumeSessionResponse:
        session = self._sessions.resume(CallContext.of(context), request.session_id)
        return session_pb2.ResumeSessionResponse(session=session)

    async def ListSessions(
        self, request: session_pb2.ListSessionsRequest, context: object
    ) -> session_pb2.ListSessionsResponse:
        return self._sessions.list_sessions(CallContext.of(context), request)

    async def GetSession(
        self, request: session_pb2.GetSessionRequest, context: object
    ) -> session_pb2.GetSessionResponse:
        return self._sessions.show(CallContext.of(context), request.session_id)

    async def DeleteSession(
        self, request: session_pb2.DeleteSessionRequest, context: object
    ) -> session_pb2.DeleteSessionResponse:
        self._sessions.delete(CallContext.of(context), request.session_id)
        return session_pb2.DeleteSessionResponse(session_id=request.session_id)

    async def ExportSession(
        self, request: session_pb2.ExportSessionRequest, context: object
    ) -> session_pb2.ExportSessionResponse:
        return self._sessions.export(CallContext.of(context), request.session_id)

    async def ImportSession(
        self, request: session_pb2.ImportSessionRequest, context: object
    ) -> session_pb2.ImportSessionResponse:
        session = self._sessions.import_(CallContext.of(context), request)
        return session_pb2.ImportSessionResponse(session=session)

    async def TellSession(
        self, request: session_pb2.TellSessionRequest, context: object
    ) -> session_pb2.TellSessionResponse:
        return await self._sessions.tell(CallContext.of(context), request)
