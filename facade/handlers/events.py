"""events.subscribe: the event log as a server stream.

The log hands the same event object to every subscriber that reads it (live, or from the
backlog at about the same time, while several are attached); each is then wrapped in its
response once, for all of them. A backlog event comes already in one: the log parses it
there (``EventLog.response_of``), which spares a copy per event.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import NamedTuple

from cleveragents.acp.contract.batched import Batched
from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.contract.recent import Recent
from cleveragents.acp.facade.domain.events.log import EventLog
from cleveragents.acp.facade.domain.events.subscription import Subscription
from cleveragents.acp.facade.domain.events.tickets import StreamTickets
from cleveragents.acp.facade.handlers.table import handles
from cleveragents.acp.v1 import events_pb2


class EventHandlers:
    def __init__(self, log: EventLog, tickets: StreamTickets | None = None) -> None:
        self._log = log
        self._tickets = tickets
        self._wrapped: Recent[int, _Wrapped] = Recent(WRAPPED_CACHE_SIZE)

    @handles("events.subscribe")
    def SubscribeEvents(
        self, request: events_pb2.SubscribeEventsRequest, ctx: CallContext
    ) -> AsyncIterator[events_pb2.SubscribeEventsResponse]:
        """Not a generator: the subscription is opened (authorized, its filters checked,
        attached to the log) before this returns, so early errors precede any headers."""
        return Batched(self._responses(self._log.subscription(ctx, request)))

    @handles("events.ticket")
    async def CreateStreamTicket(
        self, request: events_pb2.CreateStreamTicketRequest, ctx: CallContext
    ) -> events_pb2.CreateStreamTicketResponse:
        if self._tickets is None:
            raise ACPError(
                ErrorCode.NOT_FOUND, "this server issues no stream tickets", {"operation": "events.ticket"}
            )
        return await self._tickets.issue(ctx, request)

    def _response(self, event: events_pb2.Event) -> events_pb2.SubscribeEventsResponse:
        # A backlog event comes in the response it was parsed in.
        carried = self._log.response_of(event)
        if carried is not None:
            return carried
        # By identity: the entry holds the event, so its id cannot name another object. An
        # event shared when it was read is looked up even if the others detached since.
        found = self._wrapped.get(id(event))
        if found is not None and found.event is event:
            return found.response
        response = _wrap(event)
        if self._log.fanning_out:
            self._wrapped.put(id(event), _Wrapped(event, response))
        return response

    async def _responses(
        self, subscription: Subscription
    ) -> AsyncGenerator[list[events_pb2.SubscribeEventsResponse], None]:
        """The responses of the events the subscription hands out together, as one list."""
        respond = self._response
        async with subscription:
            while True:
                try:
                    events = await subscription.next_batch()
                except StopAsyncIteration:
                    return
                yield [respond(event) for event in events]


def _wrap(event: events_pb2.Event) -> events_pb2.SubscribeEventsResponse:
    response = events_pb2.SubscribeEventsResponse()
    response.event.CopyFrom(event)  # half the cost of SubscribeEventsResponse(event=event)
    return response


# Responses kept (per generation of the cache) for the other subscribers of their event.
WRAPPED_CACHE_SIZE = 2048


class _Wrapped(NamedTuple):
    event: events_pb2.Event
    response: events_pb2.SubscribeEventsResponse
