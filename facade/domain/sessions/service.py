"""Sessions: a conversation between a user and an orchestrator actor (``session.*``).

``tell`` stores the user's message, runs the session's orchestrator, stores its replies
and emits one ``session.message`` event per message, each in the same transaction as the
message it reports. A session is ``active`` or ``closed``; the orchestrator's ``/close``
closes it and ``resume`` reopens it. Semantics in docs/sessions.md.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import orjson
from ulid import ULID

from cleveragents.acp.contract import limits
from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain import paging, revisions
from cleveragents.acp.facade.domain.access import roles
from cleveragents.acp.facade.domain.bounded import slices
from cleveragents.acp.facade.domain.context.service import DEFAULT_TOKEN_BUDGET, Context, Scope, session_key
from cleveragents.acp.facade.domain.models.client import ChatModels
from cleveragents.acp.facade.domain.models.deltas import Emit
from cleveragents.acp.facade.domain.orchestrators.builtin import (
    BuiltinOrchestrator,
    Orchestrator,
    PlanStarter,
)
from cleveragents.acp.facade.domain.orchestrators.model import ModelOrchestrator
from cleveragents.acp.facade.domain.registries import Registries
from cleveragents.acp.facade.domain.registries.builtins import is_builtin
from cleveragents.acp.facade.domain.registries.registry import LABEL_KEY, MAX_LABEL_VALUE
from cleveragents.acp.facade.domain.sessions import export as session_export
from cleveragents.acp.facade.domain.sessions import turns
from cleveragents.acp.facade.domain.sessions.records import (
    MESSAGES,
    SESSION_KIND,
    STATE_NAMES,
    from_record,
    load,
    messages,
    new_id,
    not_found,
    now,
    read_with_messages,
    seconds,
    set_now,
    to_record,
)
from cleveragents.acp.facade.domain.sessions.running import CURRENT, TurnRunner, fenced, still_running
from cleveragents.acp.facade.store.base import (
    ListQuery,
    Record,
    StaleRevisionError,
    Store,
    StoreConflictError,
)
from cleveragents.acp.v1 import events_pb2, plan_pb2, registry_pb2, session_pb2

# The fields session.update changes (its update_mask paths).
UPDATABLE = ("title", "labels", "project", "multitask", "automation_profile")

DEFAULT_ORCHESTRATOR = "orchestrator"
MAX_MESSAGE_CHARS = 100_000
MAX_TITLE_CHARS = 1_000
LIST_SCOPE = "session.list"
# Messages an import stores per statement (all in one transaction).
IMPORT_CHUNK = 5_000
# How many referring sessions a refused registry removal names.
MAX_REFERRERS = 20

ACTIVE = session_pb2.SESSION_STATE_ACTIVE
CLOSED = session_pb2.SESSION_STATE_CLOSED


class EventPublisher(Protocol):
    def publish(self, event: events_pb2.Event) -> events_pb2.Event: ...

    async def append(self, events: Sequence[events_pb2.Event]) -> list[events_pb2.Event]: ...


def _invalid(field: str, message: str) -> ACPError:
    return ACPError(ErrorCode.INVALID_PARAMS, message, {"field": field})


def _policy(value: int) -> session_pb2.MultitaskPolicy.ValueType:
    """A known multitask policy, or INVALID_PARAMS naming the four."""
    if value not in turns.POLICY_NAMES:
        raise ACPError(
            ErrorCode.INVALID_PARAMS,
            f"unknown multitask policy {value}; the policies are "
            + ", ".join(f"MULTITASK_POLICY_{n.upper()}" for n in turns.POLICY_NAMES.values()),
            {"field": "multitask", "policies": list(turns.POLICY_NAMES.values())},
        )
    return session_pb2.MultitaskPolicy.ValueType(value)


def label_problem(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """(``labels.<key>``, problem) for the first label breaking the registries' label rules."""
    if len(labels) > limits.MAX_MAP_ENTRIES:
        return "labels", f"at most {limits.MAX_MAP_ENTRIES} labels"
    for key, value in sorted(labels.items()):
        if not LABEL_KEY.fullmatch(key):
            return f"labels.{key}", "label keys are 1-63 of letters, digits, '.', '_', '-', '/'"
        if len(value) > MAX_LABEL_VALUE:
            return f"labels.{key}", f"label values are at most {MAX_LABEL_VALUE} characters"
    return None


class _TurnPlans:
    """The plan starter a session's orchestrators get: it notes each plan on the turn
    that started it (``Turn.plan_ids``), even when the turn is stopped before it replies.
    A turn that was stopped or taken over (its runner frozen past its lease) starts none."""

    def __init__(self, starter: PlanStarter, store: Store) -> None:
        self.starter = starter
        self.store = store

    async def start_plan(
        self,
        ctx: CallContext,
        *,
        namespace: str,
        action: str,
        project: str,
        session_id: str,
        inputs: dict[str, Any],
    ) -> plan_pb2.Plan:
        running = CURRENT.get()
        if running is not None and not await still_running(self.store, running):
            raise ACPError(
                ErrorCode.INVALID_STATE,
                f"turn {running.turn_id} was stopped or taken over by another process; it starts no plan",
                {"session_id": session_id, "turn_id": running.turn_id},
                refinement="TURN_FINISHED",
            )
        plan = await self.starter.start_plan(
            ctx, namespace=namespace, action=action, project=project, session_id=session_id, inputs=inputs
        )
        if running is not None:
            running.plan_ids.append(plan.meta.id)
        return plan


class Sessions:
    def __init__(
        self,
        store: Store,
        registries: Registries,
        events: EventPublisher,
        context: Context,
        *,
        plan_starter: PlanStarter | None = None,
        models: ChatModels | None = None,
        plan_cancel: Callable[[CallContext, str], Awaitable[Any]] | None = None,
    ) -> None:
        self.store = store
        self.registries = registries
        self.events = events
        self.context = context
        self.pages = paging.Pager(store)
        self.plan_cancel = plan_cancel
        self.runner = TurnRunner(self)
        builtin = BuiltinOrchestrator(registries, _TurnPlans(plan_starter, store) if plan_starter else None)
        # Actor provider -> the orchestrator that runs sessions of actors of that provider.
        self.orchestrators: dict[str, Orchestrator] = {BuiltinOrchestrator.provider: builtin}
        if models is not None:
            self.orchestrators[ModelOrchestrator.provider] = ModelOrchestrator(
                registries, models, builtin, self
            )
        registries.add_referrer_source(self.referrers)

    # what a model orchestrator reads and writes (model_orchestrator.SessionSide) ------

    def history(self, session_id: str) -> list[session_pb2.Message]:
        return messages(self.store, session_id)

    def token_budget(self, session: session_pb2.Session) -> int:
        config, _ = self.context.in_force(Scope(session.meta.namespace, session.project, session))
        return config.token_budget or DEFAULT_TOKEN_BUDGET

    def text(self, session: session_pb2.Session, actor: str, turn: int) -> Emit:
        running = CURRENT.get()
        turn_id = running.turn_id if running is not None else ""

        async def emit(index: int, text: str) -> None:
            delta = events_pb2.TextDelta(actor=actor, turn=turn, index=index, text=text, turn_id=turn_id)
            event = events_pb2.Event(
                namespace=session.meta.namespace, session_id=session.meta.id, session_text_delta=delta
            )
            if running is None:
                await self.events.append([event])
                return
            # Fenced like the turn's replies: a stopped or taken-over turn streams no more.
            if await fenced(self.store, running, lambda _s: self.events.publish(event)) is not None:
                running.text.setdefault(turn, []).append(text)

        return emit

    def used(self, prompt_tokens: int, completion_tokens: int) -> None:
        """A model call of the current turn used these tokens (``Turn.usage``)."""
        running = CURRENT.get()
        if running is not None:
            running.prompt_tokens += prompt_tokens
            running.completion_tokens += completion_tokens

    def referrers(self, kind: str, namespace: str, name: str) -> list[str]:
        """Sessions naming an actor (as orchestrator) or a project: they block its removal."""
        attr = {"actor": "orchestrator", "project": "project"}.get(kind)
        if attr is None:
            return []
        records = self.store.query(
            ListQuery(
                kind=SESSION_KIND, namespaces=frozenset({namespace}), attrs={attr: name}, limit=MAX_REFERRERS
            )
        )
        return [f"session/{r.id}" for r in records]

    # create, show, list, delete, resume ----------------------------------------------

    async def create(
        self, ctx: CallContext, req: session_pb2.CreateSessionRequest
    ) -> session_pb2.CreateSessionResponse:
        namespace = ctx.namespace(req.namespace)
        orchestrator = req.orchestrator or DEFAULT_ORCHESTRATOR
        if len(req.title) > MAX_TITLE_CHARS:
            raise _invalid("title", f"title is longer than {MAX_TITLE_CHARS} characters")
        problem = label_problem(req.labels)
        if problem is not None:
            raise _invalid(*problem)
        # Built in the answer itself (no copy into it afterwards), and the record from it
        # here: the writer thread, which every write waits for, only checks and inserts.
        response = session_pb2.CreateSessionResponse()
        session = response.session
        meta = session.meta
        set_now(meta.create_time)
        meta.id = new_id(meta.create_time)
        meta.namespace = namespace
        meta.update_time.CopyFrom(meta.create_time)
        session.title = req.title
        session.orchestrator = orchestrator
        session.project = req.project
        session.state = ACTIVE
        session.labels.update(req.labels)
        if req.multitask:
            session.multitask = _policy(req.multitask)
        session.automation_profile = req.automation_profile
        record = to_record(session)

        def insert(store: Store) -> None:
            # Checked in the transaction: a stored actor or project cannot go meanwhile
            # (its removal waits for this commit, then finds this session referring to it).
            problem = self._reference_problem(namespace, orchestrator, req.project)
            if problem is not None:
                raise _invalid(*problem)
            self._check_profile(ctx, namespace, req.automation_profile)
            store.insert(record)

        if req.project or req.automation_profile or not is_builtin("actor", orchestrator):
            await self.store.write(insert)
        else:
            # Nothing stored to check first (a built-in orchestrator, no project): one insert,
            # which a store may commit without its writer thread.
            await self.store.insert_alone(record)
        return response

    def _check_profile(self, ctx: CallContext, namespace: str, profile: str) -> None:
        """A session's automation override names a profile of its namespace; one allowing
        commands only an admin may set (as plan.use's override: roles.check_profile_override)."""
        if not profile:
            return
        found = self.registries.find("automation_profile", namespace, profile)
        if not isinstance(found, registry_pb2.AutomationProfile):
            raise _invalid(
                "automation_profile", f"no automation profile {profile!r} in namespace {namespace!r}"
            )
        roles.check_profile_override(ctx, found.spec, None, profile)

    def _reference_problem(self, namespace: str, orchestrator: str, project: str) -> tuple[str, str] | None:
        """(field, problem) when the orchestrator actor or the project does not exist."""
        if not self.registries.exists("actor", namespace, orchestrator):
            return "orchestrator", f"no actor {orchestrator!r} in namespace {namespace!r} to orchestrate"
        if project and not self.registries.exists("project", namespace, project):
            return "project", f"no project {project!r} in namespace {namespace!r}"
        return None

    async def show(
        self, ctx: CallContext, req: session_pb2.GetSessionRequest
    ) -> session_pb2.GetSessionResponse:
        session_id = req.session_id
        # One snapshot: the record and its messages agree.
        session, history = await read_with_messages(self.store, ctx, session_id)
        if not req.page_size and not req.page_token:
            return session_pb2.GetSessionResponse(
                session=session, messages=history, turns=await self._turns_of(session_id, history)
            )

        def after(position: str | None, limit: int) -> list[session_pb2.Message]:
            start = 0 if position is None else int(position) + 1
            return history[start : start + limit]

        page, next_token = self.pages.page(
            "session.messages", {"session_id": session_id}, req, after, lambda m: str(m.index)
        )
        return session_pb2.GetSessionResponse(
            session=session,
            messages=page,
            next_page_token=next_token,
            turns=await self._turns_of(session_id, page),
        )

    async def _turns_of(
        self, session_id: str, shown: Sequence[session_pb2.Message]
    ) -> list[session_pb2.Turn]:
        """The turns of the user's messages shown, in order (none for a history from before 1.3)."""
        ids = [m.turn_id for m in shown if m.turn_id and m.role == session_pb2.MESSAGE_ROLE_USER]
        if not ids:
            return []
        return await self.store.read(lambda store: turns.by_ids(store, session_id, ids))

    async def list_sessions(
        self, ctx: CallContext, req: session_pb2.ListSessionsRequest
    ) -> session_pb2.ListSessionsResponse:
        namespaces = ctx.visible_namespaces(req.namespace)
        state = None
        if req.state != session_pb2.SESSION_STATE_UNSPECIFIED:
            state = STATE_NAMES.get(req.state)
            if state is None:
                raise _invalid("state", f"unknown session state {req.state}")
        attrs = {
            key: value for key, value in (("orchestrator", req.actor), ("project", req.project)) if value
        }
        filters = {
            "namespaces": sorted(namespaces) if namespaces is not None else None,
            "state": state,
            "attrs": attrs,
        }

        def fetch(after: str | None, limit: int) -> Awaitable[list[Record]]:
            query = ListQuery(
                SESSION_KIND, namespaces, state=state, attrs=attrs, before_id=after, limit=limit
            )
            return self.store.read_query(query)

        records, token = await self.pages.page_async(LIST_SCOPE, filters, req, fetch, lambda r: r.id)
        return session_pb2.ListSessionsResponse(
            sessions=[from_record(r) for r in records], next_page_token=token
        )

    async def delete(self, ctx: CallContext, session_id: str) -> None:
        def delete(store: Store) -> None:
            with store.transaction():
                record, _ = load(store, ctx, session_id)
                expected = revisions.check(ctx, "session", session_id, record.revision)
                try:
                    deleted = store.delete(SESSION_KIND, session_id, expected_revision=expected)
                except StaleRevisionError as exc:
                    raise revisions.mismatch("session", session_id, expected, exc.current) from None
                if not deleted:
                    raise not_found(session_id)
                store.delete_items(MESSAGES, session_id)
                for turn in turns.of_session(store, session_id):
                    store.delete_items(turns.PENDING, turn.id)
                    store.delete(turns.TURN_KIND, turns.key(session_id, turn.id))
                self.context.configs.delete(record.namespace, session_key(session_id))

        await self.store.write(delete)

    async def update(
        self, ctx: CallContext, req: session_pb2.UpdateSessionRequest
    ) -> session_pb2.UpdateSessionResponse:
        """Title, labels (replaced whole), project, multitask policy and automation profile,
        checked as session.create checks them; one ``session.updated`` event in the same
        transaction."""
        paths = list(dict.fromkeys(req.update_mask.paths))
        if not paths:
            raise _invalid("update_mask", f"name the fields to change: {', '.join(UPDATABLE)}")
        for path in paths:
            if path not in UPDATABLE:
                raise _invalid(
                    "update_mask", f"session.update cannot change {path!r}; it changes {', '.join(UPDATABLE)}"
                )
        given = req.session
        if "title" in paths and len(given.title) > MAX_TITLE_CHARS:
            raise _invalid("session.title", f"title is longer than {MAX_TITLE_CHARS} characters")
        if "multitask" in paths:
            _policy(given.multitask)
        if "labels" in paths:
            problem = label_problem(given.labels)
            if problem is not None:
                raise _invalid(f"session.{problem[0]}", problem[1])
        return await self.store.write(lambda _store: self._update(ctx, req.session_id, given, paths))

    def _update(
        self, ctx: CallContext, session_id: str, given: session_pb2.Session, paths: list[str]
    ) -> session_pb2.UpdateSessionResponse:
        with self.store.transaction():
            record, session = load(self.store, ctx, session_id)
            expected = revisions.check(ctx, "session", session_id, record.revision)
            namespace = session.meta.namespace
            if (
                "project" in paths
                and given.project
                and not self.registries.exists("project", namespace, given.project)
            ):
                raise _invalid("session.project", f"no project {given.project!r} in namespace {namespace!r}")
            if "automation_profile" in paths:
                try:
                    self._check_profile(ctx, namespace, given.automation_profile)
                except ACPError as exc:
                    if exc.details.get("field") == "automation_profile":
                        exc.details["field"] = "session.automation_profile"
                    raise
            for path in paths:
                if path == "labels":
                    session.labels.clear()
                    session.labels.update(given.labels)
                else:
                    setattr(session, path, getattr(given, path))
            session.meta.update_time.CopyFrom(now())
            self._save(session, expected, ctx)
            self.events.publish(
                events_pb2.Event(
                    namespace=namespace,
                    session_id=session_id,
                    session_updated=events_pb2.SessionUpdated(session=session, fields=paths),
                )
            )
        return session_pb2.UpdateSessionResponse(session=session)

    async def resume(self, ctx: CallContext, session_id: str) -> session_pb2.Session:
        return await self.store.write(lambda _store: self._resume(ctx, session_id))

    def _resume(self, ctx: CallContext, session_id: str) -> session_pb2.Session:
        with self.store.transaction():
            record, session = load(self.store, ctx, session_id)
            expected = revisions.check(ctx, "session", session_id, record.revision)
            if session.state != CLOSED:
                raise ACPError(
                    ErrorCode.INVALID_STATE,
                    f"session {session_id} is {STATE_NAMES[session.state]}; only a closed session resumes",
                    {"session_id": session_id, "state": STATE_NAMES[session.state]},
                )
            session.state = ACTIVE
            session.meta.update_time.CopyFrom(now())
            self._save(session, expected, ctx)
        return session

    def claim_revision(self, ctx: CallContext, record: Record, session: session_pb2.Session) -> None:
        """A tell or turn cancel naming an expected revision: compare it and move the
        session's revision in the caller's transaction (the write that admits the turn or
        records the cancel), so of two callers holding the same revision exactly one gets
        through. Without one, neither touches the session record (no contention)."""
        if ctx.if_revision is None:
            return
        expected = revisions.check(ctx, "session", session.meta.id, record.revision)
        session.meta.update_time.CopyFrom(now())
        self._save(session, expected, ctx)

    def _save(self, session: session_pb2.Session, read_revision: int, ctx: CallContext | None = None) -> None:
        """Write the session at the next revision if the record is still at ``read_revision``
        (the compare-and-set the caller's expected revision rides on)."""
        try:
            self.store.update(to_record(session, read_revision + 1), expected_revision=read_revision)
        except StaleRevisionError as exc:
            if ctx is not None and ctx.if_revision is not None:
                raise revisions.mismatch("session", session.meta.id, read_revision, exc.current) from None
            raise self._changed(session) from None
        except KeyError:
            raise self._changed(session) from None

    @staticmethod
    def _changed(session: session_pb2.Session) -> ACPError:
        return ACPError(
            ErrorCode.INVALID_STATE,
            f"session {session.meta.id} changed or went away meanwhile; read it again",
            {"session_id": session.meta.id},
        )

    # tell -----------------------------------------------------------------------------

    async def tell(
        self, ctx: CallContext, req: session_pb2.TellSessionRequest
    ) -> session_pb2.TellSessionResponse:
        if req.multitask:
            _policy(req.multitask)

        def admitted(store: Store) -> Orchestrator:
            _, session = load(store, ctx, req.session_id)
            if len(req.content) > MAX_MESSAGE_CHARS:
                raise _invalid("content", f"a message holds at most {MAX_MESSAGE_CHARS} characters")
            self.check_open(session)
            return self._orchestrator(session)

        orchestrator = await self.store.read(admitted)
        return await self.runner.tell(ctx, req, orchestrator)

    def check_open(self, session: session_pb2.Session) -> None:
        if session.state == CLOSED:
            raise ACPError(
                ErrorCode.INVALID_STATE,
                f"session {session.meta.id} is closed; session.resume reopens it",
                {"session_id": session.meta.id, "state": "closed"},
            )

    async def get_turn(
        self, ctx: CallContext, req: session_pb2.GetTurnRequest
    ) -> session_pb2.GetTurnResponse:
        def read(store: Store) -> session_pb2.GetTurnResponse:
            load(store, ctx, req.session_id)
            got = turns.read(store, req.session_id, req.turn_id)
            if got is None or got[1].session_id != req.session_id:
                raise turns.not_found(req.session_id, req.turn_id)
            turn = got[1]
            wanted = {turn.message_id, *turn.reply_ids}
            shown = [m for m in messages(store, req.session_id) if m.id in wanted]
            if turn.state == turns.QUEUED:
                waiting = turns.pending(store, turn.id)
                shown = [waiting] if waiting is not None else []
            return session_pb2.GetTurnResponse(turn=turn, messages=shown)

        return await self.store.read(read)

    async def cancel_turn(
        self, ctx: CallContext, req: session_pb2.CancelTurnRequest
    ) -> session_pb2.CancelTurnResponse:
        turn = await self.runner.cancel(ctx, req, self.plan_cancel)
        return session_pb2.CancelTurnResponse(turn=turn)

    def recover(self) -> None:
        """At start, before any call (blocking): settle the turns stopped processes left."""
        self.runner.recover()

    async def close(self) -> None:
        await self.runner.close()

    def _orchestrator(self, session: session_pb2.Session) -> Orchestrator:
        namespace, name = session.meta.namespace, session.orchestrator
        actor = self.registries.find("actor", namespace, name)
        if not isinstance(actor, registry_pb2.Actor):
            raise ACPError(
                ErrorCode.INVALID_STATE,
                f"the session's orchestrator actor {name!r} no longer exists in namespace {namespace!r}",
                {"session_id": session.meta.id, "orchestrator": name},
            )
        orchestrator = self.orchestrators.get(actor.spec.provider)
        if orchestrator is None:
            providers = sorted(self.orchestrators)
            raise ACPError(
                ErrorCode.INVALID_STATE,
                f"actor {name!r} has provider {actor.spec.provider!r}, which cannot orchestrate a session "
                f"on this server; providers that can: {', '.join(providers)}",
                {
                    "session_id": session.meta.id,
                    "orchestrator": name,
                    "provider": actor.spec.provider,
                    "orchestrating_providers": providers,
                },
            )
        return orchestrator

    def remove_messages(self, session_id: str, turn_id: str) -> None:
        """Take a turn's messages out of the history (a ``rollback``): the messages after
        them move up, so indices stay 0..n-1. In the caller's transaction."""
        with self.store.transaction():
            record = self.store.get(SESSION_KIND, session_id)
            if record is None:
                return
            session = session_pb2.Session.FromString(record.body)
            history = messages(self.store, session_id)
            kept = [m for m in history if m.turn_id != turn_id]
            if len(kept) == len(history):
                return
            for index, msg in enumerate(kept):
                msg.index = index
            self.store.delete_items(MESSAGES, session_id)
            if kept:
                self.store.append_items(
                    MESSAGES, session_id, [m.SerializeToString(deterministic=True) for m in kept]
                )
            session.message_count = len(kept)
            session.meta.update_time.CopyFrom(now())
            self._save(session, record.revision)

    def append_now(
        self, session_id: str, new: Iterable[session_pb2.Message], *, close: bool = False
    ) -> list[session_pb2.Message]:
        """Store messages after the history, update the session, emit one event each.

        The session is re-read inside the transaction: the orchestrator ran in between."""
        with self.store.transaction():
            record = self.store.get(SESSION_KIND, session_id)
            if record is None:
                raise not_found(session_id)
            session = session_pb2.Session.FromString(record.body)
            stamp = now()
            stored: list[session_pb2.Message] = []
            for offset, given in enumerate(new):
                msg = session_pb2.Message()
                msg.CopyFrom(given)
                msg.id = given.id or str(ULID())
                msg.index = session.message_count + offset
                msg.create_time.CopyFrom(stamp)
                stored.append(msg)
            indices = self.store.append_items(
                MESSAGES, session_id, [m.SerializeToString(deterministic=True) for m in stored]
            )
            if indices != [m.index for m in stored]:
                raise RuntimeError(f"session {session_id}: message_count disagrees with its stored history")
            session.message_count += len(stored)
            session.meta.update_time.CopyFrom(stamp)
            if close:
                session.state = CLOSED
            self._save(session, record.revision)
            for msg in stored:
                self.events.publish(
                    events_pb2.Event(
                        namespace=session.meta.namespace,
                        session_id=session_id,
                        session_message=events_pb2.SessionMessage(message=msg),
                    )
                )
        return stored

    # export, import -------------------------------------------------------------------

    async def export(self, ctx: CallContext, session_id: str) -> session_pb2.ExportSessionResponse:
        return await self.store.read(lambda _store: self._export(ctx, session_id))

    def _export(self, ctx: CallContext, session_id: str) -> session_pb2.ExportSessionResponse:
        record, session = load(self.store, ctx, session_id)
        history = messages(self.store, session_id)
        config = self.context.configs.get(record.namespace, session_key(session_id))
        ended = []
        for turn in turns.of_session(self.store, session_id):
            if turn.state in turns.ACTIVE_STATES:
                # Exported as it will be imported: a copy runs nothing.
                turns.end(turn, turns.CANCELLED, now(), "exported while it was queued or running")
                if not turn.HasField("start_time"):
                    continue
            ended.append(turn)
        document = session_export.build(session, history, config, now(), ended)
        response = session_pb2.ExportSessionResponse()
        response.document.update(document)
        # Never a document session.import would refuse: measured as JSON (HTTP) and protobuf (gRPC).
        size = max(len(orjson.dumps(document)), response.ByteSize())
        if size > limits.MAX_SESSION_DOCUMENT_BYTES:
            raise ACPError(
                ErrorCode.INVALID_STATE,
                f"session {session_id} exports as {size} bytes, more than the "
                f"{limits.MAX_SESSION_DOCUMENT_BYTES} an import takes; its history is too long to export",
                {
                    "session_id": session_id,
                    "bytes": size,
                    "max_bytes": limits.MAX_SESSION_DOCUMENT_BYTES,
                },
                refinement="SESSION_TOO_LARGE",
            )
        return response

    async def import_(self, ctx: CallContext, req: session_pb2.ImportSessionRequest) -> session_pb2.Session:
        # Read in slices: a 30,000-message document held every other call for seconds. Each
        # message becomes its stored row on the loop, so the writer thread (every other
        # caller's writes wait for it) only checks references and stores.
        imported = await slices.run_sliced(session_export.parsing(req.document))
        await self.store.read(lambda _store: self._check_import(ctx, req, imported))
        return await self.store.write(lambda _store: self._store_import(imported))

    def _check_import(
        self, ctx: CallContext, req: session_pb2.ImportSessionRequest, imported: session_export.Imported
    ) -> None:
        session = imported.session
        namespace = ctx.namespace(req.namespace or session.meta.namespace)
        session.meta.namespace = namespace
        if req.new_id:
            # Same creation instant, fresh randomness: the session still lists where it was made.
            session.meta.id = str(ULID.from_timestamp(seconds(session.meta.create_time)))
            # Turn records are keyed by session and turn id: the copy keeps its turn ids.
        problem = label_problem(session.labels) or self._reference_problem(
            namespace, session.orchestrator, session.project
        )
        if problem is not None:
            raise session_export.invalid(f"$.session.{problem[0]}", problem[1])
        if imported.context is not None:
            try:
                self.context.validate(namespace, imported.context, prefix="$.context")
            except ACPError as exc:
                path = str(exc.details.get("field", "$.context"))
                raise session_export.invalid(path, exc.message.removeprefix(f"{path}: ")) from None

    def _store_import(self, imported: session_export.Imported) -> session_pb2.Session:
        """One transaction: a refused or failed import leaves nothing behind. The rows go in
        chunks, so a store never encodes the whole history into one statement at once."""
        session = imported.session
        namespace = session.meta.namespace
        clash = ACPError(
            ErrorCode.ALREADY_EXISTS,
            f"a session with id {session.meta.id} exists; import with new_id to take a fresh id",
            {"session_id": session.meta.id},
            refinement="SESSION_ALREADY_EXISTS",
        )
        rows = imported.rows
        with self.store.transaction():
            if self.store.get(SESSION_KIND, session.meta.id) is not None:
                raise clash
            try:
                self.store.insert(to_record(session))
            except StoreConflictError:
                raise clash from None
            for start in range(0, len(rows), IMPORT_CHUNK):
                self.store.append_items(MESSAGES, session.meta.id, rows[start : start + IMPORT_CHUNK])
            if imported.context is not None:
                self.context.configs.put(namespace, session_key(session.meta.id), imported.context)
            for turn in imported.turns:
                turn.session_id = session.meta.id
                try:
                    self.store.insert(turns.to_record(turn, namespace))
                except StoreConflictError:
                    raise ACPError(
                        ErrorCode.ALREADY_EXISTS,
                        f"session {session.meta.id} already has a turn with id {turn.id}",
                        {"turn_id": turn.id},
                        refinement="SESSION_ALREADY_EXISTS",
                    ) from None
        return session
