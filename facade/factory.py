"""Assembles a ``ServiceFacade`` over a store: the composition root of the Application layer.

Presentation code opens a facade here and never touches the store or domain modules.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import pwd
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from google.protobuf import message

from cleveragents.acp.facade.domain.access.policy import CommandUser, Policy, check_root_template
from cleveragents.acp.facade.domain.context.service import CONTEXT_KIND, Context
from cleveragents.acp.facade.domain.events.log import DEFAULT_POLL_INTERVAL, EventLog
from cleveragents.acp.facade.domain.events.tickets import PrincipalLookup, StreamTickets
from cleveragents.acp.facade.domain.models.client import ChatModels
from cleveragents.acp.facade.domain.models.settings import ModelSettings
from cleveragents.acp.facade.domain.plans.approvals import KIND as APPROVAL_KIND
from cleveragents.acp.facade.domain.plans.engine import PlanEngine
from cleveragents.acp.facade.domain.plans.records import KIND as PLAN_KIND
from cleveragents.acp.facade.domain.registries import Registries
from cleveragents.acp.facade.domain.registries.kinds import KINDS
from cleveragents.acp.facade.domain.registries.verbs import RegistryVerbs
from cleveragents.acp.facade.domain.sessions import records as session_records
from cleveragents.acp.facade.domain.sessions.records import SESSION_KIND
from cleveragents.acp.facade.domain.sessions.service import Sessions
from cleveragents.acp.facade.domain.webhooks.deliverer import Deliverer
from cleveragents.acp.facade.domain.webhooks.service import Webhooks
from cleveragents.acp.facade.domain.webhooks.settings import DeliverySettings
from cleveragents.acp.facade.handlers import table
from cleveragents.acp.facade.handlers.approvals import ApprovalHandlers
from cleveragents.acp.facade.handlers.context import ContextHandlers
from cleveragents.acp.facade.handlers.events import EventHandlers
from cleveragents.acp.facade.handlers.meta import MetaHandlers
from cleveragents.acp.facade.handlers.plans import PlanHandlers
from cleveragents.acp.facade.handlers.registries import RegistryHandlers
from cleveragents.acp.facade.handlers.sessions import SessionHandlers
from cleveragents.acp.facade.handlers.webhooks import WebhookHandlers
from cleveragents.acp.facade.idempotency import DEFAULT_RETENTION_SECONDS, Idempotency
from cleveragents.acp.facade.service_facade import Authenticator, Closeable, ServiceFacade
from cleveragents.acp.facade.store.base import DEFAULT_WRITE_TIMEOUT, Store, StoreObserver
from cleveragents.acp.facade.store.pg_urls import db_problem as db_problem
from cleveragents.acp.facade.store.pg_urls import is_postgres_url, redacted
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.facade.store.wakeups import DEFAULT_WAKEUP_TICK, PeerChannel
from cleveragents.acp.v1 import approval_pb2, context_pb2, plan_pb2, session_pb2

# Seconds a PostgreSQL transaction may wait on its replica before the server ends it.
IDLE_ENV = "ACP_STORE_IDLE_TRANSACTION_SECONDS"


def default_db_path() -> str | pathlib.Path:
    """``$ACP_DB`` (a SQLite file or a ``postgresql://`` URL), else the user's data
    directory (XDG_DATA_HOME)."""
    if env := os.environ.get("ACP_DB"):
        return env if is_postgres_url(env) else pathlib.Path(env)
    data_home = os.environ.get("XDG_DATA_HOME") or str(pathlib.Path.home() / ".local" / "share")
    return pathlib.Path(data_home) / "cleveragents" / "acp.db"


def _env_number(name: str, kind: type[int] | type[float]) -> int | float | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return kind(raw)
    except ValueError:
        raise ValueError(f"${name} must be a {kind.__name__}, not {raw!r}") from None


def describe_db(db: str | pathlib.Path) -> str:
    """What a banner or an error shows of a database: the file, or the URL without its
    password."""
    return redacted(db) if isinstance(db, str) and is_postgres_url(db) else str(db)


def open_event_log(store: Store, *, follow: bool = False) -> EventLog:
    """The event log, configured from the environment: ``$ACP_EVENT_RETENTION_COUNT``
    (events kept) and ``$ACP_EVENT_RETENTION_SECONDS`` (maximum age; unset: keep all),
    ``$ACP_EVENT_QUEUE_SIZE`` (events a live subscriber may lag before it is ended),
    ``$ACP_EVENT_POLL_SECONDS`` (with ``follow``: how often the follower reads the store
    without a wake-up; default 1)."""
    count = _env_number("ACP_EVENT_RETENTION_COUNT", int)
    seconds = _env_number("ACP_EVENT_RETENTION_SECONDS", float)
    queue_size = _env_number("ACP_EVENT_QUEUE_SIZE", int)
    poll = _env_number("ACP_EVENT_POLL_SECONDS", float)
    if poll is not None and not 0 < poll <= 60:
        raise ValueError(f"$ACP_EVENT_POLL_SECONDS must be in (0, 60], not {poll}")
    return EventLog(
        store,
        queue_size=int(queue_size) if queue_size is not None else 1024,
        retention_count=int(count) if count is not None else None,
        retention_seconds=seconds,
        follow=follow,
        poll_interval=poll if poll is not None else DEFAULT_POLL_INTERVAL,
    )


def open_store(db: str | pathlib.Path, *, peers: PeerChannel | None = None) -> Store:
    """The store: PostgreSQL for a ``postgresql://`` (or ``postgres://``) URL, else the
    SQLite file. ``$ACP_STORE_WRITE_TIMEOUT_SECONDS`` bounds how long a write waits for a
    lock another process (or replica) holds before it fails with STORE_BUSY;
    ``$ACP_EVENT_WAKEUP_MS`` is how often an event follower looks for other processes'
    commits to a SQLite file (default 20; the workers of one server also wake each other at
    once through ``peers``). PostgreSQL wakes followers by LISTEN/NOTIFY instead, and
    ``$ACP_STORE_IDLE_TRANSACTION_SECONDS`` (default 10) bounds how long a replica that
    stopped answering inside a transaction keeps its locks (pg_settings.py)."""
    write_timeout = _env_number("ACP_STORE_WRITE_TIMEOUT_SECONDS", float)
    if write_timeout is not None and not 0 < write_timeout <= 3600:
        raise ValueError(f"$ACP_STORE_WRITE_TIMEOUT_SECONDS must be in (0, 3600], not {write_timeout}")
    tick = _env_number("ACP_EVENT_WAKEUP_MS", float)
    if tick is not None and not 0.1 <= tick <= 1000:
        raise ValueError(f"$ACP_EVENT_WAKEUP_MS must be in [0.1, 1000], not {tick}")
    timeout = DEFAULT_WRITE_TIMEOUT if write_timeout is None else write_timeout
    problem = db_problem(db)
    if problem is not None:
        raise ValueError(problem)
    if isinstance(db, str) and is_postgres_url(db):
        idle = _env_number(IDLE_ENV, float)
        if idle is not None and not 0 < idle <= 3600:
            raise ValueError(f"${IDLE_ENV} must be in (0, 3600], not {idle}")
        # Imported here: psycopg costs a server on the SQLite default ~10 MiB it never uses.
        from cleveragents.acp.facade.store.postgres import PostgresStore

        if idle is None:
            return PostgresStore(db, write_timeout=timeout)
        return PostgresStore(db, write_timeout=timeout, idle_timeout=idle)
    return SQLiteStore(
        db,
        write_timeout=timeout,
        wakeup_tick=DEFAULT_WAKEUP_TICK if tick is None else tick / 1000,
        peers=peers,
    )


@dataclass(frozen=True)
class WorkerSlot:
    """Which worker of ``agents serve --workers count`` a process is, and the private folder
    of the workers' wake-up sockets."""

    directory: pathlib.Path
    index: int
    count: int

    def channel(self) -> PeerChannel:
        names = [f"w{index}" for index in range(self.count)]
        return PeerChannel(self.directory, names[self.index], names)


class _StoreResource:
    def __init__(self, store: Store) -> None:
        self.store = store

    async def close(self) -> None:
        await self.store.aclose()


class _ModelsResource:
    def __init__(self, models: ChatModels) -> None:
        self.models = models

    async def close(self) -> None:
        await self.models.close()


class _EventLogResource:
    def __init__(self, events: EventLog) -> None:
        self.events = events

    async def close(self) -> None:
        # Off the loop: closing joins the follower thread.
        await asyncio.to_thread(self.events.close)


def server_policy(
    roots: Sequence[str],
    *,
    allow_commands: bool,
    command_user: str | None,
    model_endpoints: Sequence[str] = (),
    model_key_envs: Sequence[str] = (),
    webhook_allow_http: bool = False,
    webhook_allow_networks: Sequence[str] = (),
    euid: int | None = None,
) -> Policy:
    """What ``agents serve`` allows; ValueError for a root, user, model endpoint or key
    variable that cannot be used, and for commands as root without an unprivileged
    ``command_user``."""
    for root in roots:
        check_root_template(root)
    user = None
    if command_user is not None:
        try:
            account = pwd.getpwnam(command_user)
        except KeyError:
            raise ValueError(f"--command-user {command_user!r} is no user of this system") from None
        if account.pw_uid == 0:
            raise ValueError(f"--command-user {command_user!r} is root; name an unprivileged user")
        user = CommandUser(command_user, account.pw_uid, account.pw_gid)
    running_as_root = (os.geteuid() if euid is None else euid) == 0
    if allow_commands and running_as_root and user is None:
        raise ValueError(
            "the server runs as root: --allow-commands needs --command-user USER, the "
            "unprivileged account commands run as"
        )
    return Policy.server(
        roots,
        allow_commands=allow_commands,
        command_user=user if running_as_root else None,
        model_endpoints=model_endpoints,
        model_key_envs=model_key_envs,
        webhook_allow_http=webhook_allow_http,
        webhook_allow_networks=webhook_allow_networks,
    )


def entity_types() -> dict[str, type[message.Message]]:
    """Record kind -> the message its body is: what an answer lost in a crash is rebuilt
    from (facade/idempotency.py)."""
    entities: dict[str, type[message.Message]] = {
        SESSION_KIND: session_pb2.Session,
        PLAN_KIND: plan_pb2.Plan,
        CONTEXT_KIND: context_pb2.ContextConfig,
        APPROVAL_KIND: approval_pb2.Approval,
    }
    entities.update({k.record_kind: k.entry_type for k in KINDS.values()})
    return entities


def open_facade(
    db: str | pathlib.Path | None = None,
    *,
    authenticator: Authenticator | None = None,
    policy: Policy | None = None,
    follow: bool = False,
    worker: WorkerSlot | None = None,
    request_retention: float = DEFAULT_RETENTION_SECONDS,
    takeover: bool = False,
    deliver_webhooks: bool | None = None,
) -> ServiceFacade:
    """A facade over the database ``db``: a SQLite file or a PostgreSQL URL (default:
    ``default_db_path()``).

    ``follow``: its subscribers also get the events other processes commit to the file
    (servers, workers, a local ``events watch``; see ``EventLog``). ``worker``: this process is
    one of a server's workers, which wake each other's followers at once (``--workers``).

    Without an authenticator the facade runs in local mode: every call acts as the
    local principal with access to all namespaces. ``policy`` is what the operator
    allows (resource roots, commands); by default the local one (``Policy.local``).
    ``request_retention``: seconds a mutating call's answer is kept for retries.
    ``takeover`` (a server; needs a running loop): take over, while open, the plans of
    processes on the same database that stop (docs/plans.md, "Leases").
    ``deliver_webhooks`` (default: as ``takeover``): this process delivers webhooks
    (docs/webhooks.md); a facade that does not still serves the webhook operations."""
    where = db if db is not None else default_db_path()
    # PostgreSQL wakes followers itself (LISTEN/NOTIFY): the sockets are for a SQLite file.
    on_sqlite = not (isinstance(where, str) and is_postgres_url(where))
    store = open_store(where, peers=worker.channel() if worker is not None and on_sqlite else None)
    events = open_event_log(store, follow=follow)
    registries = Registries(store, policy if policy is not None else Policy.local())
    context = Context(store, registries, session_records.load)
    # Model servers: retries, backoff and timeouts from $ACP_MODEL_* (docs/actors.md).
    models = ChatModels(ModelSettings.from_env(os.environ), egress=registries.policy.models)
    plans = PlanEngine(events, registries, models, takeover=takeover)
    # Settles plans a stopped server left running or half-applied, before any call.
    plans.recover()
    sessions = Sessions(
        store, registries, events, context, plan_starter=plans, models=models, plan_cancel=plans.cancel
    )
    # Settles turns a stopped server left queued or running: what it accepted stays in the history.
    sessions.recover()
    egress = registries.policy.webhooks
    deliverer = (
        Deliverer(store, events, egress, DeliverySettings.from_env())
        if (takeover if deliver_webhooks is None else deliver_webhooks)
        else None
    )
    webhooks = Webhooks(store, egress, deliverer)
    tickets = StreamTickets(store, authenticator if isinstance(authenticator, PrincipalLookup) else None)
    handlers = table.build(
        [
            MetaHandlers(),
            EventHandlers(events, tickets),
            RegistryHandlers(RegistryVerbs(registries)),
            SessionHandlers(sessions),
            ContextHandlers(context),
            PlanHandlers(plans),
            WebhookHandlers(webhooks),
            ApprovalHandlers(plans),
        ]
    )
    # Closed in reverse: the event log ends its subscriptions before the store goes.
    resources: list[Closeable] = [
        _StoreResource(store),
        _EventLogResource(events),
        _ModelsResource(models),
        plans,
        sessions,
    ]
    if deliverer is not None:
        resources.append(deliverer)
    return ServiceFacade(
        handlers,
        authenticator=authenticator,
        tickets=tickets,
        resources=resources,
        inspector=_Inspector(store, deliverer),
        idempotency=Idempotency(store, entity_types(), retention_seconds=request_retention),
    )


class _Inspector:
    """What the server's readiness and metrics read from the store (off the loop, on a
    store reader thread, in one snapshot)."""

    def __init__(self, store: Store, deliverer: Deliverer | None = None) -> None:
        self._store = store
        self._deliverer = deliverer

    async def probe(self) -> None:
        """The store answers, and its writes can succeed (a full disk: not ready)."""
        await self._store.read(_probe)

    async def census(self) -> tuple[int, dict[tuple[str, str], int]]:
        return await self._store.read(_census)

    def observe_store(self, observer: StoreObserver) -> None:
        self._store.observe(observer)

    def read_cache_counts(self) -> tuple[int, int]:
        return self._store.read_cache_counts()

    def webhook_counts(self) -> tuple[dict[str, int], dict[tuple[str, str], int]]:
        if self._deliverer is None:
            return {}, {}
        stats = self._deliverer.stats
        return dict(stats.results), dict(stats.backlog)

    def observe_webhook_latency(self, observer: Callable[[float], None]) -> None:
        if self._deliverer is not None:
            self._deliverer.latency_observer = observer


def _probe(store: Store) -> None:
    store.last_sequence()
    store.check_writable()


def _census(store: Store) -> tuple[int, dict[tuple[str, str], int]]:
    plans = Counter((record.attrs.get("phase", ""), record.state) for record in store.iter_kind(PLAN_KIND))
    return store.last_sequence(), dict(plans)
