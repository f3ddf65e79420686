"""Running a session's turns: the multitask policy, the queue, background turns, cancel.

A tell stores a queued turn (``turns.py``) and a driver task in the accepting process
waits until its turn heads the session's queue and the session's run lease is free,
claims it, moves the user's message into the history and runs the orchestrator. Every
write of a running turn is fenced by its lease token, so a runner declared dead (its
lease lapsed and someone settled its turn) stores nothing more. Semantics:
docs/sessions.md, "Turns".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from ulid import ULID

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.orchestrators.builtin import Orchestrator, Outcome
from cleveragents.acp.facade.domain.plans import leases as plan_leases
from cleveragents.acp.facade.domain.plans.leases import holder_gone, new_owner, ttl_from_env
from cleveragents.acp.facade.domain.sessions import turns
from cleveragents.acp.facade.domain.sessions.records import SESSION_KIND, load, now
from cleveragents.acp.facade.store.base import Lease, LeaseLostError, Record, StaleRevisionError, Store
from cleveragents.acp.v1 import events_pb2, session_pb2


class _Publisher(Protocol):
    def publish(self, event: events_pb2.Event) -> events_pb2.Event: ...


class _Feed(Protocol):
    def __aiter__(self) -> AsyncIterator[events_pb2.Event]: ...

    def close(self) -> None: ...


@runtime_checkable
class _Followed(Protocol):
    """An event log that also delivers what other processes commit (``EventLog``)."""

    @property
    def delivered_sequence(self) -> int: ...

    def subscribe(
        self, *, namespaces: frozenset[str] | None, event_types: Sequence[str] = (), after_sequence: int = 0
    ) -> _Feed: ...


class Sessions(Protocol):
    """What running a turn needs of the sessions service (``service.Sessions``), which owns
    the history; a protocol, so this module does not import the service that drives it."""

    @property
    def store(self) -> Store: ...

    @property
    def events(self) -> _Publisher: ...

    def check_open(self, session: session_pb2.Session) -> None: ...

    def claim_revision(self, ctx: CallContext, record: Record, session: session_pb2.Session) -> None: ...

    def append_now(
        self, session_id: str, new: Iterable[session_pb2.Message], *, close: bool = False
    ) -> list[session_pb2.Message]: ...

    def remove_messages(self, session_id: str, turn_id: str) -> None: ...


log = logging.getLogger(__name__)
T = TypeVar("T")

# How often a runner looks for a stop request left on its lease by another process, and a
# waiting turn looks again whether the turn before it ended in another process.
POLL_SECONDS = 0.1
# How long session.cancel_turn waits for the turn to end before answering it as it is.
CANCEL_WAIT_SECONDS = 5.0
ENQUEUE = session_pb2.MULTITASK_POLICY_ENQUEUE
REJECT = session_pb2.MULTITASK_POLICY_REJECT
INTERRUPT = session_pb2.MULTITASK_POLICY_INTERRUPT
ROLLBACK = session_pb2.MULTITASK_POLICY_ROLLBACK
# Stop kinds: what a request on a run lease asks, as "<kind>:<turn id>".
CANCEL, STOP_INTERRUPT, STOP_ROLLBACK = "cancel", "interrupt", "rollback"
_STOPS = (CANCEL, STOP_INTERRUPT, STOP_ROLLBACK)


@dataclass
class Running:
    """A turn this process runs: what its orchestrator produced so far."""

    turn_id: str
    session_id: str
    token: int
    stop: asyncio.Future[str]
    plan_ids: list[str] = field(default_factory=list)
    # Streamed text per model turn (what an interrupt keeps, marked partial).
    text: dict[int, list[str]] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def request(self, kind: str) -> None:
        if not self.stop.done():
            self.stop.set_result(kind)


# The turn the current task runs for (set in the orchestrator's task only).
CURRENT: ContextVar[Running | None] = ContextVar("acp_session_turn", default=None)


async def fenced(store: Store, running: Running, write: Callable[[Store], T]) -> T | None:
    """``write`` in a transaction that first checks the turn's run lease is still its
    runner's (token and expiry, on the store's clock), as every write of a turn is: a runner
    frozen past its lease and taken over (SIGSTOP, a long GC pause) stores nothing more when
    it wakes. None, and the turn asked to stop, when the lease is lost or a stop was asked."""
    if running.stop.done():
        return None

    def guarded(s: Store) -> T:
        s.check_lease(turns.run_lease(running.session_id), running.token)
        return write(s)

    try:
        return await store.write(guarded)
    except LeaseLostError:
        running.request("lost")
        return None


async def still_running(store: Store, running: Running) -> bool:
    """Whether the turn's runner still holds its lease (a read: before a side effect that
    cannot share the lease's transaction, such as starting a plan)."""
    if running.stop.done():
        return False
    lease = await store.read(lambda s: s.get_lease(turns.run_lease(running.session_id)))
    if lease is not None and lease.live and lease.token == running.token:
        return True
    running.request("lost")
    return False


@dataclass(frozen=True)
class _Started:
    turn: session_pb2.Turn
    message: session_pb2.Message
    session: session_pb2.Session
    token: int


@dataclass(frozen=True)
class _Ended:
    response: session_pb2.TellSessionResponse
    error: ACPError | None = None


_Try = _Started | _Ended | None


def _event(session: session_pb2.Session | str, namespace: str, **payload: Any) -> events_pb2.Event:
    session_id = session if isinstance(session, str) else session.meta.id
    return events_pb2.Event(namespace=namespace, session_id=session_id, **payload)


class TurnRunner:
    """The turns of one facade: drivers, runners, the heartbeat of their leases."""

    def __init__(self, sessions: Sessions, *, ttl: float | None = None) -> None:
        self.sessions = sessions
        self.store: Store = sessions.store
        self.ttl = ttl if ttl is not None else ttl_from_env()
        self.owner = new_owner()
        plan_leases.opened(self.owner)
        # Leases this process holds: name -> token (run leases and queued turns' leases).
        self.held: dict[str, int] = {}
        self.running: dict[str, Running] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self._beat: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        # Turns of this process waiting for their place, and what wakes them when a turn
        # ends in another process (a feed of session.turn_completed events).
        self._waiting = 0
        self._watcher: asyncio.Task[None] | None = None
        self._closed = False

    # tell -----------------------------------------------------------------------------

    async def tell(
        self, ctx: CallContext, req: session_pb2.TellSessionRequest, orchestrator: Orchestrator
    ) -> session_pb2.TellSessionResponse:
        turn, message, stops, qtoken = await self.store.write(lambda _s: self._enter(ctx, req))
        self.held[turns.queue_lease(turn.id)] = qtoken
        for turn_id, kind in stops:
            local = self.running.get(turn_id)
            if local is not None:
                local.request(kind)
        self._changed_now()
        self._heartbeat()
        task = asyncio.get_running_loop().create_task(
            self._drive(_unconditional(ctx), turn.session_id, turn.id, orchestrator)
        )
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if req.background:
            task.add_done_callback(_log_failure)
            return session_pb2.TellSessionResponse(message=message, turn=turn)
        # A caller that stops waiting does not cut the turn in half (session.tell's
        # when_abandoned): the turn runs on and is stored all the same.
        return await asyncio.shield(task)

    def _enter(
        self, ctx: CallContext, req: session_pb2.TellSessionRequest
    ) -> tuple[session_pb2.Turn, session_pb2.Message, list[tuple[str, str]], int]:
        """Store the queued turn; under ``reject`` refuse, under ``interrupt``/``rollback``
        stop the turns before it (in the same transaction)."""
        store = self.store
        srecord, session = load(store, ctx, req.session_id)
        self.sessions.claim_revision(ctx, srecord, session)
        self.sessions.check_open(session)
        namespace = session.meta.namespace
        policy = req.multitask or session.multitask or ENQUEUE
        stamp = now()
        turn = session_pb2.Turn(
            id=str(ULID()),
            session_id=session.meta.id,
            state=turns.QUEUED,
            message_id=str(ULID()),
            multitask=policy,
            background=req.background,
            create_time=stamp,
        )
        stops: list[tuple[str, str]] = []
        ahead = turns.active(store, session.meta.id)
        if ahead and policy == REJECT:
            running = [t for _, t in ahead if t.state == turns.RUNNING]
            raise turns.in_progress(session.meta.id, (running or [ahead[0][1]])[0])
        if ahead and policy in (INTERRUPT, ROLLBACK):
            kind = STOP_INTERRUPT if policy == INTERRUPT else STOP_ROLLBACK
            why = f"stopped by turn {turn.id} (multitask {turns.POLICY_NAMES[policy]})"
            for record, other in ahead:
                if other.state == turns.QUEUED:
                    self._settle_queued(record, other, turns.CANCELLED, why, namespace)
                elif store.request_lease(turns.run_lease(session.meta.id), f"{kind}:{other.id}"):
                    stops.append((other.id, kind))
                else:
                    self._settle_dead(record, other, kind, namespace)
        message = session_pb2.Message(
            id=turn.message_id,
            role=session_pb2.MESSAGE_ROLE_USER,
            content=req.content,
            turn_id=turn.id,
            create_time=stamp,
        )
        store.insert(turns.to_record(turn, namespace))
        store.append_items(turns.PENDING, turn.id, [message.SerializeToString(deterministic=True)])
        lease = store.claim_lease(turns.queue_lease(turn.id), self.owner, self.ttl)
        if lease is None:
            raise RuntimeError(f"the new turn {turn.id}'s queue lease is held")
        return turn, message, stops, lease.token

    # waiting for the turn's place ---------------------------------------------------------

    async def _drive(
        self, ctx: CallContext, session_id: str, turn_id: str, orchestrator: Orchestrator
    ) -> session_pb2.TellSessionResponse:
        waited = False
        try:
            while True:
                # Taken before looking, so a turn ending while we look still wakes us.
                changed = self._changed
                # The first try is the write itself (an idle session's tell, the common
                # case, starts in one store round trip); a turn that waits then looks with
                # reads until a write could get anywhere.
                if not waited or await self.store.read(lambda _s: self._may_start(session_id, turn_id)):
                    got: _Try = await self.store.write(lambda _s: self._try_start(session_id, turn_id))
                    if isinstance(got, _Ended):
                        if got.error is not None:
                            raise got.error
                        return got.response
                    if isinstance(got, _Started):
                        break
                if not waited:
                    waited = True
                    self._waiting += 1
                    self._watch()
                await self._wait(changed)
        finally:
            self.held.pop(turns.queue_lease(turn_id), None)
            if waited:
                self._waiting -= 1
                if not self._waiting and self._watcher is not None:
                    self._watcher.cancel()
        return await self._run(ctx, got, orchestrator)

    def _may_start(self, session_id: str, turn_id: str) -> bool:
        """Whether a write could get anywhere: the turn heads the queue, or what is ahead of
        it ended or lost its process (a read: waiting turns poll without writing)."""
        for _, head in turns.active(self.store, session_id):
            if head.id == turn_id:
                return True
            return not self._alive(head)
        return True

    def _alive(self, head: session_pb2.Turn) -> bool:
        if head.state == turns.RUNNING:
            lease = self.store.get_lease(turns.run_lease(head.session_id))
        else:
            lease = self.store.get_lease(turns.queue_lease(head.id))
        return _live(lease)

    def _try_start(self, session_id: str, turn_id: str) -> _Try:
        store = self.store
        srecord = store.get(SESSION_KIND, session_id)
        got = turns.read(store, session_id, turn_id)
        if srecord is None or got is None:
            raise ACPError(
                ErrorCode.NOT_FOUND,
                f"session {session_id} was deleted while turn {turn_id} waited to run",
                {"session_id": session_id, "turn_id": turn_id},
                refinement="SESSION_NOT_FOUND",
            )
        record, turn = got
        namespace = srecord.namespace
        if turn.state != turns.QUEUED:
            message = turns.pending(store, turn_id) or session_pb2.Message(
                id=turn.message_id, turn_id=turn.id
            )
            return _Ended(session_pb2.TellSessionResponse(message=message, turn=turn))
        for head_record, head in turns.active(store, session_id):
            if head.id == turn_id:
                break
            if self._alive(head):
                return None
            self._settle_orphan(head_record, head, namespace)
        session = session_pb2.Session.FromString(srecord.body)
        if session.state == session_pb2.SESSION_STATE_CLOSED:
            why = f"session {session_id} was closed by a turn before this one"
            ended = self._settle_queued(record, turn, turns.FAILED, why, namespace, code="INVALID_STATE")
            error = ACPError(
                ErrorCode.INVALID_STATE,
                f"{why}; session.resume reopens it",
                {"session_id": session_id, "state": "closed", "turn_id": turn_id},
            )
            return _Ended(session_pb2.TellSessionResponse(turn=ended), error)
        lease = self._claim_run(session_id)
        if lease is None:
            return None
        waiting = turns.pending(store, turn_id)
        if waiting is None:
            raise RuntimeError(f"turn {turn_id} is queued without its message")
        store.delete_items(turns.PENDING, turn_id)
        qname = turns.queue_lease(turn_id)
        if qname in self.held:
            store.release_lease(qname, self.held[qname])
        turn.state = turns.RUNNING
        turn.start_time.CopyFrom(now())
        turns.save(store, record, turn)
        self.sessions.events.publish(
            _event(session_id, namespace, session_turn_started=events_pb2.SessionTurn(turn=turn))
        )
        (stored,) = self.sessions.append_now(session_id, [waiting])
        return _Started(turn, stored, session, lease.token)

    def _claim_run(self, session_id: str) -> Lease | None:
        name = turns.run_lease(session_id)
        lease = self.store.claim_lease(name, self.owner, self.ttl)
        if lease is None:
            current = self.store.get_lease(name)
            if current is not None and holder_gone(current.owner):
                lease = self.store.claim_lease(name, self.owner, self.ttl, steal_token=current.token)
        return lease

    async def _wait(self, changed: asyncio.Event | None = None) -> None:
        """Until a turn of this process ends, a turn ends in another (``_watch``), or the
        poll interval passes (what another process's lapsed lease needs)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for((changed or self._changed).wait(), POLL_SECONDS)

    def _watch(self) -> None:
        """While turns wait here, follow the event log's ``session.turn_completed`` events
        (other processes' too: workers wake each other's followers at once, PostgreSQL
        replicas through LISTEN/NOTIFY), so a turn queued behind one that ends elsewhere
        starts at once instead of at the next poll."""
        events = self.sessions.events
        if self._closed or not isinstance(events, _Followed):
            return
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.get_running_loop().create_task(self._watching(events))

    async def _watching(self, events: _Followed) -> None:
        feed = events.subscribe(
            namespaces=None, event_types=["session.turn_completed"], after_sequence=events.delivered_sequence
        )
        try:
            async for _ in feed:
                self._changed_now()
        except ACPError:
            pass  # the feed ended (its queue overflowed, the log closed): the poll remains
        finally:
            feed.close()

    def _changed_now(self) -> None:
        """Wake this process's waiting turns (one of their sessions moved)."""
        self._changed.set()
        self._changed = asyncio.Event()

    # settling turns whose process is gone -------------------------------------------------

    def _settle_queued(
        self,
        record: Any,
        turn: session_pb2.Turn,
        state: int,
        why: str,
        namespace: str,
        *,
        code: str = "",
    ) -> session_pb2.Turn:
        turns.end(turn, state, now(), why, code)
        turns.save(self.store, record, turn)
        self.store.delete_items(turns.PENDING, turn.id)
        self._completed(turn, namespace)
        return turn

    def _settle_orphan(self, record: Any, turn: session_pb2.Turn, namespace: str) -> None:
        """End a queued or running turn whose process is gone, as failed. A queued turn's
        message was accepted (its tell may have been acknowledged, or answered as applied
        to a retry): it joins the history before the turn ends, so nothing accepted is lost."""
        if turn.state == turns.RUNNING:
            self._settle_dead(record, turn, "", namespace)
            return
        waiting = turns.pending(self.store, turn.id)
        if waiting is not None:
            self.sessions.append_now(turn.session_id, [waiting])
        why = "the server process that accepted it stopped before it ran"
        self._settle_queued(record, turn, turns.FAILED, why, namespace, code="INTERNAL_ERROR")

    def recover(self) -> None:
        """At start, before any call (blocking): settle the turns a stopped process left
        queued or running (``_settle_orphan``), so a tell it accepted is in the history even
        when no later tell comes to the session. A live holder's turns are its own; another
        host's wait for their leases to expire and are settled by the session's next tell."""
        for record in list(self.store.iter_kind(turns.TURN_KIND)):
            turn = session_pb2.Turn.FromString(record.body)
            if turn.state not in turns.ACTIVE_STATES or self._alive(turn):
                continue
            try:
                with self.store.transaction():
                    self._settle_orphan(record, turn, record.namespace)
            except (StaleRevisionError, ACPError) as exc:
                # Another process settled it first, or holds its run lease now.
                log.info("turn %s left for its current holder: %s", turn.id, exc)

    def _settle_dead(self, record: Any, turn: session_pb2.Turn, kind: str, namespace: str) -> None:
        """End a running turn whose runner is gone: claim its run lease (fencing the runner
        out, should it wake), end the turn as ``kind`` asks (``""``: failed), release."""
        name = turns.run_lease(turn.session_id)
        lease = self._claim_run(turn.session_id)
        if lease is None:
            current = self.store.get_lease(name)
            raise ACPError(
                ErrorCode.INVALID_STATE,
                f"turn {turn.id} is being ended by another server process; retry",
                {"session_id": turn.session_id, "turn_id": turn.id, "retryable": True},
                refinement="TURN_IN_PROGRESS",
            ) from LeaseLostError(name, 0, current)
        stamp = now()
        if kind == STOP_ROLLBACK:
            self.sessions.remove_messages(turn.session_id, turn.id)
            turns.end(turn, turns.CANCELLED, stamp, "rolled back by a later tell", "rolled_back")
        elif kind == STOP_INTERRUPT:
            turns.end(turn, turns.INTERRUPTED, stamp, "interrupted by a later tell")
        elif kind == CANCEL:
            turns.end(turn, turns.CANCELLED, stamp, "cancelled by session.cancel_turn")
        else:
            turns.end(turn, turns.FAILED, stamp, "the server process running it stopped", "INTERNAL_ERROR")
        turns.save(self.store, record, turn)
        self.store.release_lease(name, lease.token)
        self._completed(turn, namespace)

    def _completed(self, turn: session_pb2.Turn, namespace: str) -> None:
        self.sessions.events.publish(
            _event(turn.session_id, namespace, session_turn_completed=events_pb2.SessionTurn(turn=turn))
        )

    # running ------------------------------------------------------------------------------

    async def _run(
        self, ctx: CallContext, started: _Started, orchestrator: Orchestrator
    ) -> session_pb2.TellSessionResponse:
        loop = asyncio.get_running_loop()
        turn = started.turn
        running = Running(turn.id, turn.session_id, started.token, loop.create_future())
        name = turns.run_lease(turn.session_id)
        self.held[name] = started.token
        self.running[turn.id] = running
        self._heartbeat()
        reset = CURRENT.set(running)
        try:
            work = loop.create_task(orchestrator.respond(ctx, started.session, started.message.content))
        finally:
            CURRENT.reset(reset)
        outcome: Outcome | None = None
        error: ACPError | None = None
        kind = ""
        try:
            waits: set[asyncio.Future[Any]] = {work, running.stop}
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if work.done():
                try:
                    outcome = work.result()
                except ACPError as exc:
                    error = exc
                except Exception as exc:
                    log.exception("session %s turn %s: the orchestrator failed", turn.session_id, turn.id)
                    error = ACPError(
                        ErrorCode.INTERNAL_ERROR, f"the orchestrator failed: {type(exc).__name__}"
                    )
            else:
                kind = running.stop.result()
                work.cancel()
                # The model's stream closes as the task unwinds (its HTTP connection with it).
                await asyncio.gather(work, return_exceptions=True)
            response = await self.store.write(lambda _s: self._finish(started, running, outcome, error, kind))
        except BaseException:
            work.cancel()
            raise
        finally:
            self.running.pop(turn.id, None)
            self.held.pop(name, None)
            self._changed_now()
        if error is not None and kind == "":
            raise error
        return response

    def _finish(
        self,
        started: _Started,
        running: Running,
        outcome: Outcome | None,
        error: ACPError | None,
        kind: str,
    ) -> session_pb2.TellSessionResponse:
        store = self.store
        turn_id, session_id = running.turn_id, running.session_id
        name = turns.run_lease(session_id)
        try:
            store.check_lease(name, running.token)
        except LeaseLostError:
            # Someone declared this process dead and ended the turn: nothing more is ours.
            got = turns.read(store, session_id, turn_id)
            return session_pb2.TellSessionResponse(
                message=started.message, turn=got[1] if got else started.turn
            )
        got = turns.read(store, session_id, turn_id)
        srecord = store.get(SESSION_KIND, session_id)
        if got is None or srecord is None:
            store.release_lease(name, running.token)
            return session_pb2.TellSessionResponse(message=started.message, turn=started.turn)
        record, turn = got
        namespace = srecord.namespace
        stamp = now()
        replies: list[session_pb2.Message] = []
        close = False
        if kind == STOP_ROLLBACK:
            self.sessions.remove_messages(session_id, turn_id)
            turns.end(turn, turns.CANCELLED, stamp, "rolled back by a later tell", "rolled_back")
        elif kind == CANCEL:
            turns.end(turn, turns.CANCELLED, stamp, "cancelled by session.cancel_turn")
        elif kind == STOP_INTERRUPT:
            given = [
                session_pb2.Message(
                    role=session_pb2.MESSAGE_ROLE_ORCHESTRATOR, content="".join(parts), partial=True
                )
                for _, parts in sorted(running.text.items())
                if "".join(parts)
            ]
            replies = self._replies(started, given)
            turns.end(turn, turns.INTERRUPTED, stamp, "interrupted by a later tell")
        elif kind:
            turns.end(turn, turns.FAILED, stamp, f"the turn's runner stopped ({kind})", "INTERNAL_ERROR")
        elif error is not None:
            turns.end(turn, turns.FAILED, stamp, error.message, str(error.code))
        else:
            assert outcome is not None
            close = outcome.close
            given = [
                session_pb2.Message(
                    role=session_pb2.MESSAGE_ROLE_ORCHESTRATOR, content=r.content, plan_id=r.plan_id
                )
                for r in outcome.replies
            ]
            replies = self._replies(started, given, close=close)
            turns.end(turn, turns.SUCCEEDED, stamp)
        turn.reply_ids.extend(m.id for m in replies)
        plan_ids = list(dict.fromkeys([*running.plan_ids, *(m.plan_id for m in replies if m.plan_id)]))
        turn.plan_ids.extend(plan_ids)
        turn.usage.prompt_tokens = running.prompt_tokens
        turn.usage.completion_tokens = running.completion_tokens
        turns.save(store, record, turn)
        store.release_lease(name, running.token)
        self._completed(turn, namespace)
        return session_pb2.TellSessionResponse(message=started.message, replies=replies, turn=turn)

    def _replies(
        self, started: _Started, given: list[session_pb2.Message], *, close: bool = False
    ) -> list[session_pb2.Message]:
        for reply in given:
            reply.turn_id = started.turn.id
            reply.in_reply_to = started.message.id
        if not given and not close:
            return []
        return self.sessions.append_now(started.turn.session_id, given, close=close)

    # cancel -------------------------------------------------------------------------------

    async def cancel(
        self,
        ctx: CallContext,
        req: session_pb2.CancelTurnRequest,
        cancel_plan: Callable[[CallContext, str], Any] | None,
    ) -> session_pb2.Turn:
        ended = await self.store.write(lambda _s: self._cancel_now(ctx, req))
        if ended is None:
            local = self.running.get(req.turn_id)
            if local is not None:
                local.request(CANCEL)
            ended = await self._ended(req.session_id, req.turn_id)
        self._changed_now()
        if req.cancel_plans and cancel_plan is not None:
            plain = _unconditional(ctx)
            for plan_id in ended.plan_ids:
                with contextlib.suppress(ACPError):
                    await cancel_plan(plain, plan_id)
        return ended

    def _cancel_now(self, ctx: CallContext, req: session_pb2.CancelTurnRequest) -> session_pb2.Turn | None:
        store = self.store
        srecord, session = load(store, ctx, req.session_id)
        got = turns.read(store, req.session_id, req.turn_id)
        if got is None or got[1].session_id != req.session_id:
            raise turns.not_found(req.session_id, req.turn_id)
        record, turn = got
        self.sessions.claim_revision(ctx, srecord, session)
        if turn.state == turns.QUEUED:
            why = "cancelled by session.cancel_turn before it ran"
            return self._settle_queued(record, turn, turns.CANCELLED, why, srecord.namespace)
        if turn.state != turns.RUNNING:
            raise turns.finished(req.session_id, turn)
        if store.request_lease(turns.run_lease(req.session_id), f"{CANCEL}:{turn.id}"):
            return None
        self._settle_dead(record, turn, CANCEL, srecord.namespace)
        return turn

    async def _ended(self, session_id: str, turn_id: str) -> session_pb2.Turn:
        """The turn once it ended (its runner polls for the request), or as it is after
        ``CANCEL_WAIT_SECONDS``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CANCEL_WAIT_SECONDS
        while True:
            got = await self.store.read(lambda s: turns.read(s, session_id, turn_id))
            if got is None:
                raise turns.not_found(session_id, turn_id)
            turn = got[1]
            if turn.state not in turns.ACTIVE_STATES or loop.time() >= deadline:
                return turn
            await self._wait()

    # the heartbeat: stop requests and lease renewal ----------------------------------------

    def _heartbeat(self) -> None:
        if self._beat is None or self._beat.done():
            self._beat = asyncio.get_running_loop().create_task(self._beating())

    async def _beating(self) -> None:
        loop = asyncio.get_running_loop()
        renew_at = loop.time() + self.ttl / 3
        while self.held and not self._closed:
            await asyncio.sleep(POLL_SECONDS)
            try:
                if self.running:
                    watched = {r.session_id: r for r in self.running.values()}
                    leases = await self.store.read(functools.partial(_run_leases, sessions=watched))
                    for sid, lease in leases.items():
                        self._check(watched[sid], lease)
                if loop.time() >= renew_at and self.held:
                    held = dict(self.held)
                    renewed = await self.store.write(functools.partial(_renew, self.owner, held, self.ttl))
                    renew_at = loop.time() + self.ttl / 3
                    for lost in set(held) - set(renewed):
                        if self.held.get(lost) == held[lost]:
                            log.warning("turn lease %s (token %d) was lost", lost, held[lost])
            except Exception as exc:
                if self.store.outage(exc) is None:
                    log.exception("the turns' heartbeat failed")

    @staticmethod
    def _check(running: Running, lease: Lease | None) -> None:
        if lease is None or lease.token != running.token:
            running.request("lost")
            return
        kind, _, turn_id = lease.request.partition(":")
        if kind in _STOPS and turn_id == running.turn_id:
            running.request(kind)

    async def close(self) -> None:
        """Stop this process's turns (their leases are released so another process's
        waiting turns fail them at once instead of waiting out the lease)."""
        self._closed = True
        plan_leases.closed(self.owner)
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for helper in (self._beat, self._watcher):
            if helper is not None:
                helper.cancel()
                await asyncio.gather(helper, return_exceptions=True)
        held = dict(self.held)
        if held:
            with contextlib.suppress(Exception):
                await self.store.write(lambda s: [s.release_lease(n, t) for n, t in held.items()])


def _unconditional(ctx: CallContext) -> CallContext:
    """The call's context without its expected revision (of the session, checked when the
    turn was admitted or its cancel recorded): the plans a turn starts or cancels must not
    compare it with their own revisions."""
    if ctx.if_revision is None:
        return ctx
    return dataclasses.replace(ctx, if_revision=None)


def _renew(owner: str, held: dict[str, int], ttl: float, store: Store) -> dict[str, str]:
    return store.renew_leases(owner, held, ttl)


def _run_leases(store: Store, sessions: dict[str, Running]) -> dict[str, Lease | None]:
    return {sid: store.get_lease(turns.run_lease(sid)) for sid in sessions}


def _live(lease: Lease | None) -> bool:
    return lease is not None and bool(lease.owner) and lease.live and not holder_gone(lease.owner)


def _log_failure(task: asyncio.Task[Any]) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None and not isinstance(exc, ACPError):
        log.error("a background turn failed", exc_info=exc)
