"""Idempotent mutations by request id, once for every transport (docs/idempotency.md).

``ServiceFacade.invoke`` hands a mutating call whose caller chose its request id to
``Idempotency.run``. The first completed answer for (principal, request_id) is kept with
a digest of (operation, request) for the retention window and replayed to a retry — the
same data, marked ``ctx.reply.replayed`` — without running the call again: no second
effect, no second event. A retry arriving while the first run is still going waits for
it (up to ``wait_seconds``). The same id with another operation or request is
INVALID_PARAMS ``REQUEST_ID_REUSED``.

Exactly once across a crash: the store stamps the request's row in the transaction of
the call's effect (``Store.note_claim``), with the entity records it wrote. After a
restart, a row stamped but never answered is answered from those records (``rebuild``);
for the operations whose answer is just their entity (and request fields) that is the
very answer, so the normal path does not even store it a second time. Operations whose
answer holds more are answered by a separate write, and a crash between their effect and
that write leaves INVALID_STATE ``REQUEST_ANSWER_LOST`` (the effect happened once; read
the entity).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import logging
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from google.protobuf import message

from cleveragents.acp.contract.call import CallContext, Reply
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError, ErrorCode, internal_error
from cleveragents.acp.contract.stopping import Effect, server_stopping
from cleveragents.acp.facade.store.base import Store
from cleveragents.acp.facade.store.requests import CLAIM, Claim, RequestClaimedError, RequestEntry

log = logging.getLogger(__name__)

# A claim's owner: this process and a counter (unique among the claims of every process).
_PROCESS = os.urandom(8).hex()
_CLAIMS = itertools.count()

DEFAULT_RETENTION_SECONDS = 24 * 3600.0
# How long a retry waits for the run of the same request id still going before it is told
# to try again (BUDGET_EXCEEDED, retryable, REQUEST_IN_PROGRESS).
DEFAULT_WAIT_SECONDS = 30.0
# Retention (a pass over the stored rows in key order): rows read per step, and calls with
# a request id between steps; about 4 rows read per such call, so a pass keeps ahead of
# the rows those calls add.
SWEEP_ROWS = 1024
SWEEP_EVERY = 256
# Test-only: the server SIGKILLs itself after the effect of this operation committed and
# before its answer is stored or sent (tests/gateway/test_idempotency_served.py). Unset: inert.
KILL_AFTER_COMMIT_ENV = "ACP_TEST_KILL_AFTER_COMMIT"

# Errors meaning "nothing happened, try again": never stored (a retry runs the call), as
# long as the run wrote nothing. Admission errors (authentication, version, required
# fields, bounds) happen before a run starts and are never stored either.
_NOT_STORED_CODES = frozenset({"AUTH_REQUIRED", "AUTH_FORBIDDEN", "VERSION_MISMATCH", "INTERNAL_ERROR"})


def nothing_happened(err: ACPError) -> bool:
    """The error says the call had no effect and may be retried as it was: a retryable
    error (STORE_BUSY, REQUEST_IN_PROGRESS: ``details.retryable``), one that says so
    (``details.effect`` ``none``: STORE_DISK_FULL, whose retry succeeds once space is
    freed), an authentication or authorization refusal, a version mismatch, or an internal
    fault."""
    return (
        err.code in _NOT_STORED_CODES
        or err.details.get("retryable") is True
        or err.details.get("effect") == "none"
    )


def _kept(err: ACPError, stamped: bool) -> bool:
    """Whether a run's error becomes its request id's answer: one that does not say
    "nothing happened", or any once the run wrote (its stamp may have committed), except a
    retryable one. That says "retry the call": replayed, every retry would hear it again
    until its client gave up. Its stamp alone tells the retry (docs/idempotency.md):
    committed, the effect happened once (rebuilt, or REQUEST_ANSWER_LOST); rolled back,
    nothing happened and the retry runs. A store lost mid-write (STORE_UNAVAILABLE) or a
    lock waited out after the stamp (STORE_BUSY on PostgreSQL) is such an error."""
    if err.details.get("retryable") is True:
        return False
    return stamped or not nothing_happened(err)


def _maybe_applied(err: ACPError) -> ACPError:
    """``err``, which says nothing happened (STORE_DISK_FULL), raised after the run had
    already written (a ``session.tell`` stores the question, then fails to store the
    replies): that earlier write may have committed, so its effect is ``unknown``."""
    return ACPError(
        err.code,
        f"{err.message} (an earlier write of this call may have been kept: read before retrying)",
        {**err.details, "effect": "unknown"},
    )


def digest_of(op: Operation, request: message.Message) -> bytes:
    return hashlib.sha256(op.key.encode() + b"\0" + request.SerializeToString(deterministic=True)).digest()


def reused(request_id: str, operation: str) -> ACPError:
    return ACPError(
        ErrorCode.INVALID_PARAMS,
        f"request id {request_id!r} was used for another call ({operation} with other parameters); "
        "a retry must repeat the call exactly, a new call needs a new request id",
        {"field": "request_id", "request_id": request_id, "operation": operation},
        refinement="REQUEST_ID_REUSED",
    )


def in_progress(request_id: str, waited: float) -> ACPError:
    return ACPError(
        ErrorCode.BUDGET_EXCEEDED,
        f"the call with request id {request_id!r} is still running after {waited:.1f} s; "
        "retry it later with the same request id to get its answer",
        {"retryable": True, "request_id": request_id, "waited_seconds": round(waited, 3)},
        refinement="REQUEST_IN_PROGRESS",
    )


def answer_lost(request_id: str, operation: str) -> ACPError:
    return ACPError(
        ErrorCode.INVALID_STATE,
        f"the call with request id {request_id!r} ({operation}) took effect once, but the server "
        "stopped before its answer was stored; read the entity to see the outcome",
        {"request_id": request_id, "operation": operation},
        refinement="REQUEST_ANSWER_LOST",
    )


def _error_bytes(err: ACPError) -> bytes:
    return orjson.dumps({"code": err.code, "message": err.message, "details": err.details}, default=str)


def _error_of(blob: bytes) -> ACPError:
    data = orjson.loads(blob)
    return ACPError(data["code"], data["message"], data["details"])


@dataclass
class _Outcome:
    response: message.Message | None = None
    error: ACPError | None = None

    def unwrap(self) -> message.Message:
        if self.error is not None:
            raise self.error
        assert self.response is not None
        return self.response


class _Running:
    """A run of one request id in this process; duplicates wait on ``done`` (made by the
    first duplicate: most runs have none)."""

    __slots__ = ("digest", "done", "operation", "outcome", "settled")

    def __init__(self, operation: str, digest: bytes) -> None:
        self.operation = operation
        self.digest = digest
        self.done: asyncio.Event | None = None
        self.outcome: _Outcome | None = None
        self.settled = False

    async def wait(self) -> None:
        if not self.settled:
            if self.done is None:
                self.done = asyncio.Event()
            await self.done.wait()

    def settle(self, outcome: _Outcome | None) -> None:
        self.outcome = outcome
        self.settled = True
        if self.done is not None:
            self.done.set()


# The operation's handler (``handlers.table.Unary``).
Handler = Callable[[Any, CallContext], Awaitable[message.Message]]

# A response field filled from the records a call wrote (entity kinds), or from the
# request's field of the same name.
_Shape = tuple[tuple[Any, frozenset[str] | None], ...]


class Idempotency:
    def __init__(
        self,
        store: Store,
        entities: Mapping[str, type[message.Message]],
        *,
        retention_seconds: float = DEFAULT_RETENTION_SECONDS,
        wait_seconds: float = DEFAULT_WAIT_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """``entities``: record kind -> the message its body is (what a rebuild may use)."""
        if not retention_seconds > 0:
            raise ValueError(f"the request id retention must be positive, not {retention_seconds}")
        self.store = store
        self.retention = retention_seconds
        self.wait_seconds = wait_seconds
        self.clock = clock
        self._kinds: dict[str, frozenset[str]] = {}
        for kind, cls in entities.items():
            name = cls.DESCRIPTOR.full_name
            self._kinds[name] = self._kinds.get(name, frozenset()) | {kind}
        self._shapes: dict[str, _Shape | None] = {}
        self._running: dict[tuple[str, str], _Running] = {}
        self._pruned = 0.0
        self._prune_task: asyncio.Task[None] | None = None
        # Where the pass of the retention sweep goes on (None: no pass under way).
        self._sweep_after: tuple[str, str] | None = None
        self._since_step = 0
        self._kill_after = os.environ.get(KILL_AFTER_COMMIT_ENV, "")
        # Set by a stopping server (``ServiceFacade.cut``): a cancelled run is a cut call,
        # answered with whether it took effect, not a caller that left.
        self.cutting = False

    # the facade's entry ------------------------------------------------------------

    async def run(
        self,
        op: Operation,
        request: message.Message,
        ctx: CallContext,
        handler: Handler,
    ) -> message.Message:
        """``handler(request, ctx)`` once for (principal, request id), or its stored outcome."""
        principal = ctx.require_principal().name
        key = (principal, ctx.request_id)
        digest = digest_of(op, request)
        running = self._running.get(key)
        if running is not None:
            return await self._join(running, op, digest, ctx)
        running = self._running[key] = _Running(op.key, digest)
        outcome: _Outcome | None = None
        try:
            self._maybe_prune()
            if self._shape(op) is None:
                # Its answer cannot be rebuilt and it may act outside the store (a model, files)
                # before it first writes: look for a stored answer before running it.
                stored = await self.store.read(lambda store: store.get_request(principal, ctx.request_id))
                if stored is not None and stored.time >= self.clock() - self.retention:
                    outcome = self._stored_outcome(stored, op, request, digest)
                    return _replay(outcome, ctx)
            outcome, replayed = await self._first(op, request, ctx, handler, digest, principal)
            return _replay(outcome, ctx) if replayed else outcome.unwrap()
        finally:
            running.settle(outcome)
            del self._running[key]

    async def _join(
        self, running: _Running, op: Operation, digest: bytes, ctx: CallContext
    ) -> message.Message:
        """A duplicate of a run still going in this process: its answer, once there."""
        if running.operation != op.key or running.digest != digest:
            raise reused(ctx.request_id, running.operation)
        started = time.monotonic()
        try:
            await asyncio.wait_for(running.wait(), self.wait_seconds)
        except TimeoutError:
            raise in_progress(ctx.request_id, time.monotonic() - started) from None
        if running.outcome is None:
            # The first run ended with nothing to replay (cancelled, or an error that
            # stores nothing): this retry is the call now.
            raise in_progress(ctx.request_id, time.monotonic() - started)
        return _replay(running.outcome, ctx)

    async def _first(
        self,
        op: Operation,
        request: message.Message,
        ctx: CallContext,
        handler: Handler,
        digest: bytes,
        principal: str,
    ) -> tuple[_Outcome, bool]:
        """Run the call under a claim; (outcome, whether it is another run's replayed).

        A retry of an operation whose answer can be rebuilt is not looked up first: its
        first write finds the stored row (the stamp conflicts), rolls back, and the stored
        answer is replayed; so is one that ends without writing and finds the row when it
        stores its answer. Every such operation writes before it acts outside the store."""
        now = self.clock()
        entry = RequestEntry(
            principal=principal,
            request_id=ctx.request_id,
            operation=op.key,
            digest=digest,
            owner=f"{_PROCESS}-{next(_CLAIMS)}",
            time=now,
        )
        claim = Claim(entry, cutoff=now - self.retention)
        token = CLAIM.set(claim)
        outcome: _Outcome | None = None
        try:
            outcome = _Outcome(response=await handler(request, ctx))
        except asyncio.CancelledError:
            if not self.cutting:
                raise
            cut = await self._cut(op, claim, ctx)
            # Not stored: a retry is answered from the stamp (applied) or runs the call.
            return _Outcome(error=cut), False
        except RequestClaimedError:
            pass
        except ACPError as err:
            outcome = _Outcome(error=err)
        except Exception as exc:
            fault = internal_error(exc, op.name)
            fault.__cause__ = exc
            outcome = _Outcome(error=fault)
        finally:
            claim.open = False
            CLAIM.reset(token)
        if outcome is None or claim.conflict:
            # Another run of this id stored its row first: its effect and answer, not ours
            # (our write rolled back).
            return await self._theirs(op, request, ctx, digest), True
        if outcome.error is not None:
            error = outcome.error
            if claim.stamped and error.details.get("effect") == "none":
                error = _maybe_applied(error)
                outcome = _Outcome(error=error)
            if _kept(error, claim.stamped):
                entry.answer, entry.error = _error_bytes(error), True
                if not await self._store_answer(claim):
                    return await self._theirs(op, request, ctx, digest), True
            return outcome, False
        response = outcome.unwrap()
        if self._kill_after == op.name:
            log.warning("%s=%s: killing the server after the commit", KILL_AFTER_COMMIT_ENV, op.name)
            os.kill(os.getpid(), signal.SIGKILL)
        if not (claim.stamped and self._stamp_answers(op, request, entry.written, response)):
            entry.answer = response.SerializeToString(deterministic=True)
            if not await self._store_answer(claim):
                return await self._theirs(op, request, ctx, digest), True
        return outcome, False

    async def _cut(self, op: Operation, claim: Claim, ctx: CallContext) -> ACPError:
        """What a call cut by a stopping server is told: once the writes it made have
        settled, its request id's row says whether its effect committed (the row is
        stamped in the effect's own transaction)."""
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        effect: Effect = "none" if not op.when_abandoned else "unknown"
        try:
            for settled in claim.pending:
                await settled.wait()
            if claim.stamped:
                principal, request_id = claim.entry.principal, claim.entry.request_id
                stored = await self.store.read(lambda store: store.get_request(principal, request_id))
                if stored is not None:
                    effect = "applied"
        except Exception:
            log.exception("a cut call of request id %r: its outcome could not be read", ctx.request_id)
            effect = "unknown"
        return server_stopping(op.name, ctx.request_id, effect)

    async def _store_answer(self, claim: Claim) -> bool:
        """Keep the answer; False when another run's row holds the id. A failure to store
        is logged, not the caller's: its call happened, and a retry is answered from the
        stamp (or told REQUEST_ANSWER_LOST)."""
        entry, cutoff = claim.entry, claim.cutoff
        try:
            return await self.store.write(lambda store: store.answer_request(entry, cutoff))
        except Exception:
            log.exception("storing the answer of request id %r failed", entry.request_id)
            return True

    async def _theirs(
        self, op: Operation, request: message.Message, ctx: CallContext, digest: bytes
    ) -> _Outcome:
        """The outcome of the run whose row holds the id (an earlier one, or one still
        going in another process: its answer, waited for up to ``wait_seconds`` when it
        cannot be rebuilt)."""
        principal = ctx.require_principal().name
        started = time.monotonic()
        while True:
            stored = await self.store.read(lambda store: store.get_request(principal, ctx.request_id))
            if stored is None:
                raise in_progress(ctx.request_id, time.monotonic() - started)
            if stored.answer is not None or self._shape(op) is not None:
                return self._stored_outcome(stored, op, request, digest)
            if time.monotonic() - started >= self.wait_seconds:
                raise in_progress(ctx.request_id, time.monotonic() - started)
            await asyncio.sleep(0.05)

    # stored answers ----------------------------------------------------------------

    def _stored_outcome(
        self, stored: RequestEntry, op: Operation, request: message.Message, digest: bytes
    ) -> _Outcome:
        if stored.operation != op.key or stored.digest != digest:
            raise reused(stored.request_id, stored.operation)
        if stored.answer is not None:
            if stored.error:
                return _Outcome(error=_error_of(stored.answer))
            return _Outcome(response=op.response_type.FromString(stored.answer))
        rebuilt = self.rebuild(op, request, stored.written)
        if rebuilt is None:
            return _Outcome(error=answer_lost(stored.request_id, op.name))
        return _Outcome(response=rebuilt)

    def _shape(self, op: Operation) -> _Shape | None:
        """How ``op``'s answer is rebuilt, or None when it holds more than entities
        and request fields (a repeated field, a message no record is)."""
        if op.key in self._shapes:
            return self._shapes[op.key]
        shape: list[tuple[Any, frozenset[str] | None]] = []
        request_fields = op.request_type.DESCRIPTOR.fields_by_name
        found: _Shape | None = None
        for field in op.response_type.DESCRIPTOR.fields:
            if field.is_repeated:
                break
            if field.message_type is not None:
                kinds = self._kinds.get(field.message_type.full_name)
                if kinds is None:
                    break
                shape.append((field, kinds))
                continue
            twin = request_fields.get(field.name)
            if twin is None or twin.type != field.type or twin.is_repeated:
                break
            shape.append((field, None))
        else:
            found = tuple(shape)
        self._shapes[op.key] = found
        return found

    def rebuild(
        self, op: Operation, request: message.Message, written: dict[tuple[str, str], bytes]
    ) -> message.Message | None:
        """``op``'s answer from the records the call wrote and its request; None when its
        answer cannot be rebuilt so."""
        shape = self._shape(op)
        if shape is None:
            return None
        response = op.response_type()
        for field, kinds in shape:
            if kinds is None:
                setattr(response, field.name, getattr(request, field.name))
                continue
            body = _last_body(written, kinds)
            if body is not None:
                getattr(response, field.name).ParseFromString(body)
        return response

    def _stamp_answers(
        self,
        op: Operation,
        request: message.Message,
        written: dict[tuple[str, str], bytes],
        response: message.Message,
    ) -> bool:
        """Whether ``rebuild`` gives ``response`` (then the stamp is the stored answer): the
        bytes of each entity field compared first, the messages only when those differ."""
        shape = self._shape(op)
        if shape is None:
            return False
        for field, kinds in shape:
            if kinds is None:
                if getattr(response, field.name) != getattr(request, field.name):
                    return False
                continue
            body = _last_body(written, kinds)
            if body is None or not response.HasField(field.name):
                return False
            value = getattr(response, field.name)
            if value.SerializeToString(deterministic=True) != body and value != type(value).FromString(body):
                return False
        return True

    # retention ---------------------------------------------------------------------

    def _maybe_prune(self) -> None:
        """Drop rows past retention in passes over the table, a pass starting at most every
        quarter of it (and every minute); within a pass, a step of ``SWEEP_ROWS`` rows every
        ``SWEEP_EVERY`` calls (a store with an index on time takes a pass in one step)."""
        if self._prune_task is not None:
            return
        if self._sweep_after is not None:
            self._since_step += 1
            if self._since_step < SWEEP_EVERY:
                return
        else:
            now = self.clock()
            if now - self._pruned < min(60.0, self.retention / 4):
                return
            self._pruned = now
        self._since_step = 0
        self._prune_task = asyncio.get_running_loop().create_task(self._prune(self.clock() - self.retention))

    async def _prune(self, older_than: float) -> None:
        after = self._sweep_after
        try:
            removed, self._sweep_after = await self.store.write(
                lambda store: store.sweep_requests(older_than, after, SWEEP_ROWS)
            )
            if removed:
                log.debug("pruned %d request ids older than the retention", removed)
        except Exception:
            self._sweep_after = None
            log.exception("pruning request ids failed")
        finally:
            self._prune_task = None

    async def close(self) -> None:
        task = self._prune_task
        if task is not None:
            with contextlib.suppress(Exception):
                await task


def _last_body(written: dict[tuple[str, str], bytes], kinds: frozenset[str]) -> bytes | None:
    """The body of the last record of one of ``kinds`` the call wrote."""
    for key in reversed(written):
        if key[0] in kinds:
            return written[key]
    return None


def _replay(outcome: _Outcome, ctx: CallContext) -> message.Message:
    if ctx.reply is None:
        ctx.reply = Reply()
    ctx.reply.replayed = True
    return outcome.unwrap()
