"""``ServiceFacade``: the one entry point every transport calls.

It dispatches an operation of the catalog through the handler table (``handlers.table``)
and runs, once for every transport, the checks no wire may skip: authentication, version
gating, required fields, and the mapping of unexpected faults to INTERNAL_ERROR with a
correlation id. Authorization is the domain's, on the call's ``CallContext``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping
from typing import Protocol, cast

from google.protobuf import message

from cleveragents.acp.contract import revisions, surface
from cleveragents.acp.contract.batched import Batched, close_iterator, next_batch
from cleveragents.acp.contract.call import LOCAL_PRINCIPAL, CallContext, Principal, ambiguous_credentials
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError, ErrorCode, internal_error
from cleveragents.acp.contract.limits import check_bounds
from cleveragents.acp.contract.required import check_required
from cleveragents.acp.contract.stopping import server_stopping
from cleveragents.acp.facade import observer as observing
from cleveragents.acp.facade.domain.access import roles
from cleveragents.acp.facade.domain.events.tickets import PrincipalLookup
from cleveragents.acp.facade.handlers.table import Handler, Streaming, Unary
from cleveragents.acp.facade.idempotency import Idempotency
from cleveragents.acp.facade.observer import CallObserver
from cleveragents.acp.facade.store.base import StoreObserver

log = logging.getLogger(__name__)

# How often an open stream checks that its caller is still admitted (revoked, expired).
RECHECK_SECONDS = 0.5


class Authenticator(Protocol):
    """Turns a bearer token into a principal, or raises AUTH_REQUIRED."""

    def authenticate(self, token: str | None) -> Principal: ...


class TicketRedeemer(Protocol):
    """Turns a stream ticket into the principal it opens ``request`` for, using it up."""

    async def redeem(self, ticket: str, operation: str, request: object) -> Principal: ...


class Closeable(Protocol):
    async def close(self) -> None: ...


class Inspector(Protocol):
    """What a server reads of the backend for readiness and metrics."""

    async def probe(self) -> None:
        """Raises when the store cannot answer."""

    async def census(self) -> tuple[int, dict[tuple[str, str], int]]:
        """The event log's head sequence, and plans counted by (phase, state)."""

    def observe_store(self, observer: StoreObserver) -> None:
        """Have the store report its commit and wait times to ``observer``."""

    def read_cache_counts(self) -> tuple[int, int]:
        """Reads the store answered from memory, and those it did not, so far."""

    def webhook_counts(self) -> tuple[Mapping[str, int], Mapping[tuple[str, str], int]]:
        """This process's webhook attempts by result (succeeded, failed, refused, gone), and
        the backlog of each subscription it delivers, by (namespace, name)."""

    def observe_webhook_latency(self, observer: Callable[[float], None]) -> None:
        """Have each accepted delivery's seconds from the event's commit told to ``observer``."""


class ServiceFacade:
    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        authenticator: Authenticator | None = None,
        tickets: TicketRedeemer | None = None,
        resources: Iterable[Closeable] = (),
        observer: CallObserver | None = None,
        inspector: Inspector | None = None,
        idempotency: Idempotency | None = None,
    ) -> None:
        """``handlers`` is a table from ``handlers.table.build``, checked against the catalog;
        ``idempotency`` keeps and replays the answers of mutating calls by request id."""
        self.observer = observer
        self.idempotency = idempotency
        self.inspector = inspector
        self.authenticator = authenticator
        self.tickets = tickets
        self._resources = list(resources)
        self._handlers: dict[str, Handler] = dict(handlers)
        # The tasks of the unary calls under way: a stopping server cuts those left at the
        # end of its grace period (``cut``).
        self._calls: set[asyncio.Task[object]] = set()
        self._cutting = False

    @property
    def served_operations(self) -> frozenset[str]:
        return frozenset(self._handlers)

    def _admit(self, op: Operation, request: message.Message, ctx: CallContext) -> Handler:
        """After ``_redeem``, which set a ticket's principal."""
        if ctx.ticket is None or ctx.principal is None:
            ctx.principal = self._principal(op, ctx)
        roles.check_operation(ctx.principal, op)
        table = op.version_table
        ctx.served_version = table.negotiate(ctx.acp_version)
        table.check_operation(ctx.served_version, op.name, op.since)
        if not isinstance(request, op.request_type):
            raise ACPError(
                ErrorCode.INVALID_PARAMS,
                f"{op.name} takes {op.request_type.DESCRIPTOR.full_name}, not {type(request).__name__}",
            )
        if ctx.served_version != table.current:
            surface.check_request(request, ctx.served_version)
        if ctx.if_revision is not None:
            revisions.check_operation(op, ctx)
        check_required(request)
        check_bounds(request)
        handler = self._handlers.get(op.key)
        if handler is None:
            raise ACPError(
                ErrorCode.NOT_FOUND,
                f"operation {op.name} is not served by this server",
                {"operation": op.name},
            )
        return handler

    def _principal(self, op: Operation, ctx: CallContext) -> Principal:
        if op.anonymous:
            return ctx.principal or LOCAL_PRINCIPAL
        if self.authenticator is None:
            return LOCAL_PRINCIPAL
        return self.authenticator.authenticate(ctx.token)

    async def admit_caller(self, op: Operation, ctx: CallContext) -> None:
        """``_admit``'s caller checks alone, before the request is decoded: a gRPC server
        asks it before a large request (a session.import) takes one of the process's places,
        so callers with no valid token cannot hold them. A refusal is observed as ``invoke``'s
        would be (the request's namespace unknown yet)."""
        try:
            if ctx.ticket is not None:
                # A ticket opens one stream's request: without it, used up and refused, as
                # invoke would (tickets open no unary call).
                await self._redeem(op, None, ctx)
            if ctx.principal is None:
                ctx.principal = self._principal(op, ctx)
            roles.check_operation(ctx.principal, op)
        except ACPError as err:
            if self.observer is not None:
                self.observer.start(op, op.request_type(), ctx).finish(err.code)
            raise

    async def _redeem(self, op: Operation, request: message.Message | None, ctx: CallContext) -> None:
        """A stream ticket, used up in the store (off the loop) before any other check;
        awaited only when the call presents one."""
        if ctx.token is not None:
            raise ambiguous_credentials("a bearer token and a stream ticket")
        if self.tickets is None:
            raise ACPError(
                ErrorCode.AUTH_REQUIRED, "this server issues no stream tickets", {"scheme": "Bearer"}
            )
        ctx.principal = await self.tickets.redeem(ctx.ticket or "", op.name, request)

    async def invoke(self, op: Operation, request: message.Message, ctx: CallContext) -> message.Message:
        """One coroutine from the observer's start to its finish: a call's path is a frame
        shorter than with the observed call wrapping an inner one."""
        observed = self.observer.start(op, request, ctx) if self.observer is not None else None
        code = observing.CANCELLED
        task = asyncio.current_task()
        if task is not None:
            self._calls.add(task)
        try:
            if op.server_streaming:
                raise ACPError(ErrorCode.INVALID_PARAMS, f"{op.name} is a stream; subscribe to it")
            if ctx.ticket is not None:
                await self._redeem(op, request, ctx)
            handler = cast(Unary, self._admit(op, request, ctx))
            if op.read_only or not ctx.request_id_given or self.idempotency is None:
                try:
                    response = await handler(request, ctx)
                except ACPError:
                    raise
                except Exception as exc:
                    raise internal_error(exc, op.name) from exc
            else:
                response = await self.idempotency.run(op, request, ctx, handler)
            if ctx.served_version != op.version_table.current:
                response = surface.strip(response, ctx.served_version)
            code = observing.OK
        except asyncio.CancelledError:
            if not self._cutting:
                raise
            if task is not None:
                task.uncancel()
            # Cut outside the request id's run (which answers for itself): only a read is
            # known to have done nothing.
            cut = server_stopping(op.name, ctx.request_id, "none" if op.read_only else "unknown")
            code = cut.code
            raise cut from None
        except ACPError as err:
            code = err.code
            raise
        finally:
            if task is not None:
                self._calls.discard(task)
            if observed is not None:
                observed.finish(code)
        return response

    def cut(self) -> int:
        """A stopping server's grace period is over: cancel every unary call still under
        way; each answers INVALID_STATE ``SERVER_STOPPING`` saying whether it took effect
        (contract/stopping.py), through its own wire as any error. Returns how many."""
        self._cutting = True
        if self.idempotency is not None:
            self.idempotency.cutting = True
        calls = list(self._calls)
        for task in calls:
            task.cancel()
        return len(calls)

    async def stream(
        self, op: Operation, request: message.Message, ctx: CallContext
    ) -> AsyncIterator[message.Message]:
        """Admission happens before the first item, so early errors surface before any
        response headers are sent."""
        if self.observer is None:
            return await self._open(op, request, ctx)
        observed = self.observer.start(op, request, ctx)
        code = observing.CANCELLED
        try:
            items = await self._open(op, request, ctx)
            code = observing.OK
        except ACPError as err:
            code = err.code
            raise
        finally:
            observed.finish(code)
        return Batched(observing.watched(items, self.observer, op, ctx))

    async def _open(
        self, op: Operation, request: message.Message, ctx: CallContext
    ) -> AsyncIterator[message.Message]:
        if not op.server_streaming:
            raise ACPError(ErrorCode.INVALID_PARAMS, f"{op.name} is not a stream")
        if ctx.ticket is not None:
            await self._redeem(op, request, ctx)
        handler = cast(Streaming, self._admit(op, request, ctx))
        try:
            items = handler(request, ctx)
        except ACPError:
            raise
        except Exception as exc:
            raise internal_error(exc, op.name) from exc
        return Batched(self._guarded(items, op, ctx))

    async def _guarded(
        self, items: AsyncIterator[message.Message], op: Operation, ctx: CallContext
    ) -> AsyncGenerator[list[message.Message], None]:
        """Items as the client's version may see them, in the batches the handler hands out;
        faults as INTERNAL_ERROR. In server mode a watchdog checks the caller's credential
        every ``RECHECK_SECONDS`` while the stream is open, items or not: a revoked or
        expired principal's stream ends with AUTH_REQUIRED (issue 17, finding 5). The
        watchdog runs beside the stream, so an item costs nothing extra (a task and a timed
        wait per item cost 7x the SSE throughput). Closes ``items``."""
        where = op.name
        version = ctx.served_version
        older = version != op.version_table.current
        iterator = aiter(items)
        watched = self.authenticator is not None and ctx.principal is not None
        watch = _Watch(self._recheck, ctx) if watched else None
        try:
            while True:
                if watch is not None:
                    watch.check()
                    watch.waiting = True
                try:
                    batch = await next_batch(iterator)
                except StopAsyncIteration:
                    return
                except asyncio.CancelledError:
                    if watch is not None:
                        watch.cancelled()
                    raise
                finally:
                    if watch is not None:
                        watch.waiting = False
                yield [surface.strip(item, version) for item in batch] if older else batch
        except ACPError:
            raise
        except Exception as exc:
            raise internal_error(exc, where) from exc
        finally:
            if watch is not None:
                watch.stop()
            await close_iterator(iterator)

    def _recheck(self, ctx: CallContext) -> None:
        """Raise AUTH_REQUIRED when the stream's principal is no longer admitted, and
        AUTH_FORBIDDEN when the operator took a namespace from it: the stream was opened
        over the namespaces it had, so it ends and a new one sees only what is left."""
        opened = ctx.principal
        if self.authenticator is None or opened is None:
            return
        now: Principal | None
        if ctx.ticket is None:
            now = self.authenticator.authenticate(ctx.token)
        else:
            lookup = self.authenticator
            if not isinstance(lookup, PrincipalLookup):
                return
            now = lookup.principal_named(opened.name)
            if now is None:
                raise ACPError(
                    ErrorCode.AUTH_REQUIRED,
                    f"principal {opened.name!r} is no longer known (revoked, removed or expired)",
                    {"scheme": "Bearer", "principal": opened.name},
                    refinement="PRINCIPAL_REVOKED",
                )
        lost = _lost_namespaces(opened, now)
        if lost:
            raise ACPError(
                ErrorCode.AUTH_FORBIDDEN,
                f"principal {opened.name!r} may no longer use namespaces {lost}",
                {"principal": opened.name, "namespaces": lost},
                refinement="PRINCIPAL_NARROWED",
            )

    def start(self) -> None:
        """On the serving loop, once the facade is attached: start what its resources run
        in the background (the plan engine's takeover scanner)."""
        for resource in self._resources:
            start = getattr(resource, "start", None)
            if callable(start):
                start()

    async def close(self) -> None:
        if self.idempotency is not None:
            await self.idempotency.close()
        for resource in reversed(self._resources):
            await resource.close()


def _lost_namespaces(opened: Principal, now: Principal) -> list[str]:
    """The namespaces ``opened`` had and ``now`` lacks (``*``: it had every namespace, and
    now has only some)."""
    if now.namespaces is None:
        return []
    if opened.namespaces is None:
        return ["*"]
    return sorted(opened.namespaces - now.namespaces)


class _Watch:
    """A stream's credential watchdog: every ``RECHECK_SECONDS`` it asks ``recheck`` (the
    facade's ``_recheck``) whether the caller is still admitted. Refused while the stream
    waits for its next item, it cancels the stream's task and the stream raises the refusal
    instead (as ``asyncio.timeout`` turns its cancellation into TimeoutError); refused while
    the consumer holds an item, the stream raises it before asking for the next."""

    def __init__(self, recheck: Callable[[CallContext], None], ctx: CallContext) -> None:
        self.waiting = False
        self.refusal: ACPError | None = None
        self._recheck = recheck
        self._ctx = ctx
        self._task = asyncio.current_task()
        self._timer = asyncio.get_running_loop().call_later(RECHECK_SECONDS, self._tick)

    def _tick(self) -> None:
        try:
            self._recheck(self._ctx)
        except ACPError as refusal:
            self.refusal = refusal
            if self.waiting and self._task is not None:
                self._task.cancel()
            return
        self._timer = asyncio.get_running_loop().call_later(RECHECK_SECONDS, self._tick)

    def check(self) -> None:
        """Before the stream asks for its next item (in the task that will wait for it)."""
        if self.refusal is not None:
            raise self.refusal
        self._task = asyncio.current_task()

    def cancelled(self) -> None:
        """The stream's wait was cancelled: by this watchdog, raise its refusal instead."""
        if self.refusal is not None and self._task is not None and self._task.uncancel() == 0:
            raise self.refusal from None

    def stop(self) -> None:
        self._timer.cancel()
