"""The facade's stand-in while it opens: ``agents serve`` listens before the store is
migrated and plans a stopped server left are settled (both off the event loop), so
``/readyz`` can say ``migrating`` meanwhile instead of the port staying closed.

A call arriving before the facade is open is refused INVALID_STATE (refinement NOT_READY,
retryable), as ``/readyz`` is. Once open, ``invoke`` and ``stream`` are the facade's own
bound methods: no frame of this class is in any later call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from google.protobuf import message

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.service_facade import ServiceFacade

MIGRATING = "migrating"

Invoke = Callable[[Operation, message.Message, CallContext], Coroutine[Any, Any, message.Message]]
Stream = Callable[
    [Operation, message.Message, CallContext], Coroutine[Any, Any, AsyncIterator[message.Message]]
]


def not_ready() -> ACPError:
    return ACPError(
        ErrorCode.INVALID_STATE,
        "not ready: the server is opening its store (migrations run); retry shortly",
        {"status": MIGRATING, "retryable": True},
        refinement="NOT_READY",
    )


class OpeningService:
    def __init__(self) -> None:
        self.invoke: Invoke = self._refuse
        self.stream: Stream = self._refuse_stream
        self._facade: ServiceFacade | None = None

    def serve(self, facade: ServiceFacade) -> None:
        """From now on every call goes to ``facade``."""
        self._facade = facade
        self.invoke = facade.invoke
        self.stream = facade.stream

    async def admit_caller(self, op: Operation, ctx: CallContext) -> None:
        """Refused while opening, as every call is; the facade's own once open."""
        if self._facade is None:
            raise not_ready()
        await self._facade.admit_caller(op, ctx)

    @staticmethod
    async def _refuse(op: Operation, request: message.Message, ctx: CallContext) -> message.Message:
        raise not_ready()

    @staticmethod
    async def _refuse_stream(
        op: Operation, request: message.Message, ctx: CallContext
    ) -> AsyncIterator[message.Message]:
        raise not_ready()
