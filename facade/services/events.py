"""events.subscribe: the event log as a server stream."""

from __future__ import annotations

from collections.abc import AsyncIterator

from cleveragents.acp.facade.call import CallContext
from cleveragents.acp.facade.domain.events import EventLog, Subscription
from cleveragents.acp.v1 import events_pb2, events_pb2_grpc


class EventFacade(events_pb2_grpc.EventServiceServicer):
    def __init__(self, log: EventLog) -> None:
        self._log = log

    def SubscribeEvents(
        self, request: events_pb2.SubscribeEventsRequest, context: object
    ) -> AsyncIterator[events_pb2.SubscribeEventsResponse]:
        """Authorizes, validates the filters and attaches to the log before it returns, so a
        bad filter or a forbidden namespace fails before any stream headers go out."""
        ctx = CallContext.of(context)
        subscription = self._log.subscribe(
            namespaces=ctx.visible_namespaces(request.namespace),
            plan_id=request.plan_id,
            session_id=request.session_id,
            event_types=list(request.event_type),
            after_sequence=request.after_sequence,
        )
        return _responses(subscription)


async def _responses(subscription: Subscription) -> AsyncIterator[events_pb2.SubscribeEventsResponse]:
    async with subscription:
        async for event in subscription:
            yield events_pb2.SubscribeEventsResponse(event=event)
