"""Request ids below every transport (facade/idempotency.py), over a real SQLite file and
the in-process transport: a retry is answered from the store, marked as a replay, with no
second effect; a reused id is refused; read-only calls store nothing."""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3
from collections.abc import AsyncIterator

import pytest

from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.call import CallContext, Principal, Reply
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.contract.transport import CallOptions
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.idempotency import Idempotency, nothing_happened
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.facade.store.base import Record, Store, StoreDownError, StoreFullError
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import registry_pb2, session_pb2, specs_pb2

CREATE = catalog.OPERATIONS["session.create"]
LIST = catalog.OPERATIONS["session.list"]
DELETE = catalog.OPERATIONS["session.delete"]


@pytest.fixture
async def facade(tmp_path: pathlib.Path) -> AsyncIterator[ServiceFacade]:
    made = open_facade(tmp_path / "acp.db")
    try:
        yield made
    finally:
        await made.close()


def rows(db: pathlib.Path) -> list[tuple[str, str, int, int]]:
    """(request_id, operation, has an answer, is an error) of every stored request id."""
    with sqlite3.connect(db) as conn:
        found = conn.execute(
            "SELECT request_id, operation, answer IS NOT NULL, error FROM requests ORDER BY request_id"
        ).fetchall()
    conn.close()
    return [(r[0], r[1], int(r[2]), int(r[3])) for r in found]


async def call(
    facade: ServiceFacade, op: catalog.Operation, request: object, request_id: str = ""
) -> tuple[object, bool]:
    """(response, replayed) over the in-process transport, the way ``ACPClient`` calls."""
    reply = Reply()
    options = CallOptions(acp_version=None, token=None, request_id=request_id, reply=reply)
    response = await LocalTransport(facade).call(op, request, options)  # type: ignore[arg-type]
    return response, reply.replayed


async def sessions(facade: ServiceFacade) -> list[session_pb2.Session]:
    response, replayed = await call(facade, LIST, session_pb2.ListSessionsRequest(), "list-1")
    assert not replayed
    assert isinstance(response, session_pb2.ListSessionsResponse)
    return list(response.sessions)


async def test_a_retry_gets_the_first_answer_marked_as_a_replay_and_no_second_session(
    facade: ServiceFacade, tmp_path: pathlib.Path
) -> None:
    request = session_pb2.CreateSessionRequest(title="once")
    first, replayed = await call(facade, CREATE, request, "create-1")
    assert not replayed
    again, replayed = await call(facade, CREATE, session_pb2.CreateSessionRequest(title="once"), "create-1")
    assert replayed
    assert again == first
    assert [s.meta.id for s in await sessions(facade)] == [first.session.meta.id]  # type: ignore[attr-defined]
    # session.create's answer is its session: the stamp written with it is the answer
    # (no second write), and the read-only session.list stored nothing.
    assert rows(tmp_path / "acp.db") == [("create-1", "session.create", 0, 0)]


async def test_without_a_request_id_of_the_callers_every_call_runs(facade: ServiceFacade) -> None:
    ctx = CallContext(request_id="made-up-by-a-server")
    await facade.invoke(CREATE, session_pb2.CreateSessionRequest(title="a"), ctx)
    await facade.invoke(
        CREATE, session_pb2.CreateSessionRequest(title="a"), CallContext(request_id="made-up-by-a-server")
    )
    assert len(await sessions(facade)) == 2
    assert not ctx.replayed


async def test_a_reused_request_id_with_other_params_or_operation_is_refused(facade: ServiceFacade) -> None:
    first, _ = await call(facade, CREATE, session_pb2.CreateSessionRequest(title="one"), "same")
    with pytest.raises(ACPError) as other_params:
        await call(facade, CREATE, session_pb2.CreateSessionRequest(title="two"), "same")
    assert other_params.value.code == "INVALID_PARAMS"
    assert other_params.value.details["refinement"] == "REQUEST_ID_REUSED"
    assert other_params.value.details["operation"] == "session.create"
    session_id = first.session.meta.id  # type: ignore[attr-defined]
    with pytest.raises(ACPError) as other_op:
        await call(facade, DELETE, session_pb2.DeleteSessionRequest(session_id=session_id), "same")
    assert other_op.value.details["refinement"] == "REQUEST_ID_REUSED"
    assert [s.meta.id for s in await sessions(facade)] == [session_id]


async def test_concurrent_duplicates_run_once_and_share_the_answer(facade: ServiceFacade) -> None:
    request = session_pb2.CreateSessionRequest(title="together")
    answers = await asyncio.gather(*(call(facade, CREATE, request, "dup") for _ in range(5)))
    responses = [response for response, _ in answers]
    assert all(response == responses[0] for response in responses)
    assert sorted(replayed for _, replayed in answers) == [False, True, True, True, True]
    assert len(await sessions(facade)) == 1


async def test_an_error_is_replayed_even_once_the_call_would_succeed(
    facade: ServiceFacade, tmp_path: pathlib.Path
) -> None:
    request = session_pb2.CreateSessionRequest(orchestrator="later")
    with pytest.raises(ACPError) as first:
        await call(facade, CREATE, request, "err-1")
    assert first.value.code == "INVALID_PARAMS"
    add = catalog.OPERATIONS["actor.add"]
    spec = specs_pb2.ActorSpec(provider="scripted")
    await call(facade, add, registry_pb2.AddActorRequest(name="later", spec=spec), "add-later")
    reply = Reply()
    with pytest.raises(ACPError) as again:
        await LocalTransport(facade).call(
            CREATE, request, CallOptions(acp_version=None, token=None, request_id="err-1", reply=reply)
        )
    assert again.value == first.value
    assert reply.replayed
    assert ("err-1", "session.create", 1, 1) in rows(tmp_path / "acp.db")
    assert await sessions(facade) == []


async def test_store_busy_means_nothing_happened_so_the_retry_runs(tmp_path: pathlib.Path) -> None:
    """Another process holds the write lock: the call fails with STORE_BUSY, nothing is
    stored for its request id, and the same id runs once the lock is gone."""
    db = tmp_path / "acp.db"
    facade = open_facade(db)
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        assert facade.idempotency is not None
        store = facade.idempotency.store
        assert isinstance(store, SQLiteStore)
        store.write_timeout = 0.3
        holder.execute("BEGIN IMMEDIATE")
        request = session_pb2.CreateSessionRequest(title="busy")
        with pytest.raises(ACPError) as busy:
            await call(facade, CREATE, request, "busy-1")
        assert busy.value.details["refinement"] == "STORE_BUSY"
        assert nothing_happened(busy.value)
        holder.execute("ROLLBACK")
        _, replayed = await call(facade, CREATE, request, "busy-1")
        assert not replayed
        assert len(await sessions(facade)) == 1
    finally:
        holder.close()
        await facade.close()


async def test_a_duplicate_waits_for_the_first_run_at_most_its_bound(tmp_path: pathlib.Path) -> None:
    """The first run is held up (another process holds the write lock); a duplicate waits
    its bound, then gets a retryable REQUEST_IN_PROGRESS; the first run still ends once."""
    db = tmp_path / "acp.db"
    facade = open_facade(db)
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        idempotency = facade.idempotency
        assert idempotency is not None
        idempotency.wait_seconds = 0.2
        holder.execute("BEGIN IMMEDIATE")
        request = session_pb2.CreateSessionRequest(title="slow")
        first = asyncio.ensure_future(call(facade, CREATE, request, "slow-1"))
        await asyncio.sleep(0.05)
        with pytest.raises(ACPError) as waited:
            await call(facade, CREATE, request, "slow-1")
        assert waited.value.code == "BUDGET_EXCEEDED"
        assert waited.value.details["refinement"] == "REQUEST_IN_PROGRESS"
        assert waited.value.details["retryable"] is True
        holder.execute("ROLLBACK")
        response, replayed = await first
        assert not replayed
        again, replayed = await call(facade, CREATE, request, "slow-1")
        assert replayed
        assert again == response
        assert len(await sessions(facade)) == 1
    finally:
        holder.close()
        await facade.close()


async def test_past_retention_an_id_is_new_again_and_its_row_is_pruned(
    facade: ServiceFacade, tmp_path: pathlib.Path
) -> None:
    idempotency = facade.idempotency
    assert isinstance(idempotency, Idempotency)
    now = [1_000_000.0]
    idempotency.clock = lambda: now[0]
    idempotency.retention = 60.0
    request = session_pb2.CreateSessionRequest(title="kept")
    await call(facade, CREATE, request, "old-1")
    _, replayed = await call(facade, CREATE, request, "old-1")
    assert replayed
    now[0] += 61
    await call(facade, CREATE, session_pb2.CreateSessionRequest(title="other"), "new-1")
    if idempotency._prune_task is not None:
        await idempotency._prune_task
    assert [row[0] for row in rows(tmp_path / "acp.db")] == ["new-1"]
    _, replayed = await call(facade, CREATE, request, "old-1")
    assert not replayed
    assert len(await sessions(facade)) == 3


async def test_read_only_operations_store_nothing_and_are_never_replays(
    facade: ServiceFacade, tmp_path: pathlib.Path
) -> None:
    for _ in range(2):
        _, replayed = await call(facade, LIST, session_pb2.ListSessionsRequest(), "read-1")
        assert not replayed
    version = catalog.OPERATIONS["meta.version"]
    _, replayed = await call(facade, version, version.request_type(), "read-1")
    assert not replayed
    assert rows(tmp_path / "acp.db") == []


async def test_a_restarted_facade_replays_the_stored_answer(tmp_path: pathlib.Path) -> None:
    db = tmp_path / "acp.db"
    facade = open_facade(db)
    try:
        first, _ = await call(facade, CREATE, session_pb2.CreateSessionRequest(title="kept"), "restart-1")
        session_id = first.session.meta.id  # type: ignore[attr-defined]
        deleted, _ = await call(
            facade, DELETE, session_pb2.DeleteSessionRequest(session_id=session_id), "del-1"
        )
    finally:
        await facade.close()
    facade = open_facade(db)
    try:
        again, replayed = await call(
            facade, CREATE, session_pb2.CreateSessionRequest(title="kept"), "restart-1"
        )
        assert replayed
        assert again == first
        # The session is gone, yet its deletion's retry is answered, not NOT_FOUND.
        redeleted, replayed = await call(
            facade, DELETE, session_pb2.DeleteSessionRequest(session_id=session_id), "del-1"
        )
        assert replayed
        assert redeleted == deleted
        assert await sessions(facade) == []
    finally:
        await facade.close()


async def test_a_second_process_on_the_same_store_replays_instead_of_running(tmp_path: pathlib.Path) -> None:
    """Two facades over one file stand for two server processes: the second finds the
    first's row at its first write (the stamp conflicts), rolls its write back and replays."""
    db = tmp_path / "acp.db"
    first, second = open_facade(db), open_facade(db)
    try:
        request = session_pb2.CreateSessionRequest(title="shared")
        made, replayed = await call(first, CREATE, request, "two-1")
        assert not replayed
        again, replayed = await call(second, CREATE, request, "two-1")
        assert replayed
        assert again == made
        with pytest.raises(ACPError) as other:
            await call(second, CREATE, session_pb2.CreateSessionRequest(title="else"), "two-1")
        assert other.value.details["refinement"] == "REQUEST_ID_REUSED"
        assert len(await sessions(second)) == 1
    finally:
        await first.close()
        await second.close()


async def test_a_told_message_is_stored_once(facade: ServiceFacade, tmp_path: pathlib.Path) -> None:
    """session.tell's answer holds its messages (not rebuildable from records): its retry is
    looked up before it runs, so the orchestrator does not run again."""
    made, _ = await call(facade, CREATE, session_pb2.CreateSessionRequest(title="talk"), "talk-1")
    session_id = made.session.meta.id  # type: ignore[attr-defined]
    tell = catalog.OPERATIONS["session.tell"]
    request = session_pb2.TellSessionRequest(session_id=session_id, content="hello")
    first, replayed = await call(facade, tell, request, "tell-1")
    assert not replayed
    again, replayed = await call(facade, tell, request, "tell-1")
    assert replayed
    assert again == first
    show = catalog.OPERATIONS["session.show"]
    shown, _ = await call(facade, show, session_pb2.GetSessionRequest(session_id=session_id), "show-1")
    assert [m.content for m in shown.messages].count("hello") == 1  # type: ignore[attr-defined]
    assert ("tell-1", "session.tell", 1, 0) in rows(tmp_path / "acp.db")


# driven below the facade, each run frozen at a known point --------------------------------


def caller(name: str, request_id: str) -> CallContext:
    return CallContext(principal=Principal(name, None), request_id=request_id, request_id_given=True)


def made_by(name: str) -> session_pb2.CreateSessionResponse:
    return session_pb2.CreateSessionResponse(session=session_pb2.Session(title=f"made for {name}"))


class Held:
    """A handler that holds ``alice``'s run inside it until ``release`` is set; every
    other principal's run answers at once. ``ran`` lists who ran, in order."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.ran: list[str] = []

    async def __call__(self, request: object, ctx: CallContext) -> session_pb2.CreateSessionResponse:
        name = ctx.require_principal().name
        self.ran.append(name)
        if name == "alice":
            self.entered.set()
            await self.release.wait()
        return made_by(name)


@pytest.mark.parametrize("bobs_title", ["same", "other"])
async def test_two_principals_with_one_request_id_at_once_each_run_their_own(
    facade: ServiceFacade, bobs_title: str
) -> None:
    """Request ids are per principal, in the runs under way as in the store: bob's call with
    the id alice's running call has is bob's own call, whatever its parameters (not a
    duplicate to join, not REQUEST_ID_REUSED)."""
    idempotency = facade.idempotency
    assert idempotency is not None
    # A hang guard only: bob's run never waits for alice's (a joined run would, this long).
    idempotency.wait_seconds = 5.0
    handler = Held()
    alices = asyncio.ensure_future(
        idempotency.run(
            CREATE, session_pb2.CreateSessionRequest(title="same"), caller("alice", "r-1"), handler
        )
    )
    await handler.entered.wait()
    bob = caller("bob", "r-1")
    answer = await idempotency.run(CREATE, session_pb2.CreateSessionRequest(title=bobs_title), bob, handler)
    assert answer == made_by("bob")
    assert not bob.replayed
    assert handler.ran == ["alice", "bob"]
    handler.release.set()
    assert await alices == made_by("alice")
    # Each one's retry is answered from its own stored answer (session.create's handler
    # runs again to its first write, where the stored row is found: the design).
    for name, title in (("alice", "same"), ("bob", bobs_title)):
        retry = caller(name, "r-1")
        again = await idempotency.run(CREATE, session_pb2.CreateSessionRequest(title=title), retry, handler)
        assert (again, retry.replayed) == (made_by(name), True)


@pytest.mark.parametrize(
    "fault",
    [RuntimeError("a bug"), ACPError(ErrorCode.INTERNAL_ERROR, "a fault the handler reported")],
    ids=["exception", "acp-error"],
)
async def test_an_internal_error_is_not_stored_so_its_retry_runs_again(
    facade: ServiceFacade, tmp_path: pathlib.Path, fault: Exception
) -> None:
    """INTERNAL_ERROR says nothing about the call's effect and a retry may succeed: it is
    never replayed (as long as the run wrote nothing)."""
    idempotency = facade.idempotency
    assert idempotency is not None
    runs: list[str] = []

    async def failing_once(request: object, ctx: CallContext) -> session_pb2.CreateSessionResponse:
        runs.append(ctx.request_id)
        if len(runs) == 1:
            raise fault
        return made_by("alice")

    request = session_pb2.CreateSessionRequest(title="retried")
    with pytest.raises(ACPError) as failed:
        await idempotency.run(CREATE, request, caller("alice", "ie-1"), failing_once)
    assert failed.value.code == "INTERNAL_ERROR"
    assert rows(tmp_path / "acp.db") == []
    retry = caller("alice", "ie-1")
    assert await idempotency.run(CREATE, request, retry, failing_once) == made_by("alice")
    assert not retry.replayed
    assert runs == ["ie-1", "ie-1"]


@pytest.mark.parametrize("committed", [True, False], ids=["first-write-committed", "rolled-back"])
async def test_a_retryable_error_after_a_write_is_not_replayed_the_stamp_tells(
    facade: ServiceFacade, tmp_path: pathlib.Path, committed: bool
) -> None:
    """A run that wrote (its request id stamped) and then failed with a retryable error, the
    database lost (STORE_UNAVAILABLE, a PostgreSQL stop between session.tell's two writes):
    the error is not stored as the id's answer, or every retry would be told "retry" again
    until its client gave up (the flaky chaos case, tests/chaos/test_faults.py). The stamp
    tells the retry what happened: committed, the effect happened once (REQUEST_ANSWER_LOST,
    no second run); rolled back, nothing happened and the retry runs."""
    idempotency = facade.idempotency
    assert idempotency is not None
    store = idempotency.store
    tell = catalog.OPERATIONS["session.tell"]
    runs: list[str] = []
    record = Record(kind="note", id="n-1", namespace="default", body=b"x")

    def insert_and_lose(store: Store) -> None:
        store.insert(record)
        raise StoreDownError("server closed the connection unexpectedly")

    async def handler(request: object, ctx: CallContext) -> session_pb2.TellSessionResponse:
        runs.append(ctx.request_id)
        if len(runs) == 1:
            if committed:
                await store.write(lambda store: store.insert(record))
                raise StoreDownError("server closed the connection unexpectedly")
            await store.write(insert_and_lose)
        return session_pb2.TellSessionResponse()

    request = session_pb2.TellSessionRequest(session_id="s-1", content="hello")
    with pytest.raises(StoreDownError) as lost:
        await idempotency.run(tell, request, caller("alice", "down-1"), handler)
    assert lost.value.details["retryable"] is True
    assert rows(tmp_path / "acp.db") == ([("down-1", "session.tell", 0, 0)] if committed else [])
    retry = caller("alice", "down-1")
    if committed:
        with pytest.raises(ACPError) as answered:
            await idempotency.run(tell, request, retry, handler)
        assert answered.value.details.get("refinement") == "REQUEST_ANSWER_LOST", answered.value
        assert retry.replayed
        assert runs == ["down-1"]
    else:
        assert await idempotency.run(tell, request, retry, handler) == session_pb2.TellSessionResponse()
        assert not retry.replayed
        assert runs == ["down-1", "down-1"]


async def test_a_full_disk_after_a_write_says_the_effect_is_unknown(
    facade: ServiceFacade, tmp_path: pathlib.Path
) -> None:
    """STORE_DISK_FULL says effect ``none``; raised after the run's first write committed
    (a session.tell stored the question, then could not store the replies) that was false:
    the chaos suite's ledger found the question stored under a call "said to have no effect"
    (tests/chaos/test_faults.py, the full-disk case, 1 run in 3 of make test). It says
    ``unknown`` now, and a retry is answered from the stored refusal, not run again."""
    idempotency = facade.idempotency
    assert idempotency is not None
    store = idempotency.store
    tell = catalog.OPERATIONS["session.tell"]
    runs: list[str] = []
    record = Record(kind="note", id="n-1", namespace="default", body=b"x")

    async def handler(request: object, ctx: CallContext) -> session_pb2.TellSessionResponse:
        runs.append(ctx.request_id)
        await store.write(lambda store: store.insert(record))
        raise StoreFullError("database or disk is full")

    request = session_pb2.TellSessionRequest(session_id="s-1", content="hello")
    with pytest.raises(ACPError) as full:
        await idempotency.run(tell, request, caller("alice", "full-1"), handler)
    assert full.value.details["refinement"] == "STORE_DISK_FULL"
    assert full.value.details["effect"] == "unknown"
    assert full.value.details["retryable"] is False
    retry = caller("alice", "full-1")
    with pytest.raises(ACPError) as again:
        await idempotency.run(tell, request, retry, handler)
    assert again.value.details["effect"] == "unknown"
    assert retry.replayed
    assert runs == ["full-1"]
