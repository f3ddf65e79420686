"""A failed write leaves its connection as good as new, on both backends, through the real
facade: the calls after it on the same pooled connection read and write as before.

On PostgreSQL the failed write's ROLLBACK once made psycopg send ``DEALLOCATE ALL`` (it
does after a rollback when it has prepared statements of its own), which also dropped the
statements ``pg_wire.Wire`` had prepared on that connection: every later call on it failed
with ``prepared statement "acp_N" does not exist``, for good."""

from __future__ import annotations

import logging
import pathlib
from collections.abc import AsyncIterator

import psycopg
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.store.pg_wire import Wire
from cleveragents.acp.v1 import session_pb2
from tests import postgres

MISSING = "01ARZ3NDEKTSV4RRFFQ69G5FAV"


@pytest.fixture(params=["sqlite", "postgres"])
async def client(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> AsyncIterator[ACPClient]:
    if request.param == "sqlite":
        facade = open_facade(tmp_path / "acp.db")
        try:
            yield ACPClient(LocalTransport(facade))
        finally:
            await facade.close()
        return
    with postgres.fresh_schema("failed") as url:
        facade = open_facade(url)
        try:
            yield ACPClient(LocalTransport(facade))
        finally:
            await facade.close()


async def test_reads_and_writes_go_on_after_a_failed_write(
    client: ACPClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    created = await client.call("session.create", namespace="default")
    assert isinstance(created, session_pb2.CreateSessionResponse)
    session = created.session.meta.id
    # Calls one after another run on one writer thread's connection; enough of the same
    # statements (the event append) that psycopg would prepare its own after five.
    for turn in range(8):
        await client.call("session.tell", session_id=session, content=f"warm {turn}")
    for round_ in range(3):
        for failing in (
            client.call("session.delete", session_id=MISSING),
            client.call("session.tell", session_id=MISSING, content="nobody"),
        ):
            with pytest.raises(ACPError) as failed:
                await failing
            assert failed.value.code == "NOT_FOUND"
        told = await client.call("session.tell", session_id=session, content=f"after {round_}")
        assert isinstance(told, session_pb2.TellSessionResponse)
        assert told.message.content == f"after {round_}"
        shown = await client.call("session.show", session_id=session)
        assert isinstance(shown, session_pb2.GetSessionResponse)
        assert shown.session.meta.id == session
        other = await client.call("session.create", namespace="default")
        assert isinstance(other, session_pb2.CreateSessionResponse)
        await client.call("session.delete", session_id=other.session.meta.id)
    listed = await client.call("session.list", namespace="default")
    assert isinstance(listed, session_pb2.ListSessionsResponse)
    assert [s.meta.id for s in listed.sessions] == [session]
    # Nothing dropped the store's prepared statements (Wire's repair was never needed).
    assert "prepared statements gone" not in caplog.text


def test_wire_prepares_again_when_its_statements_were_dropped() -> None:
    """Anything that drops a connection's prepared statements behind Wire's back (a
    ``DEALLOCATE ALL`` or ``DISCARD ALL`` of its own, a pooler) costs no call: Wire
    prepares them again, inside a transaction's first statement too."""
    postgres.need()
    wire = Wire()
    with psycopg.connect(postgres.URL, autocommit=True) as conn:
        assert wire.run(conn, "SELECT %s::int + 1", (1,), "one") == (2,)
        conn.pgconn.exec_(b"DEALLOCATE ALL")
        assert wire.run(conn, "SELECT %s::int + 1", (2,), "one") == (3,)
        conn.pgconn.exec_(b"DISCARD ALL")
        assert wire.run(conn, "SELECT %s::int + 1", (3,), "one", b"BEGIN") == (4,)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        conn.pgconn.exec_(b"COMMIT")
        conn.pgconn.exec_(b"DEALLOCATE ALL")
        assert wire.run_all(conn, [("SELECT %s::int + 1", (4,))], b"BEGIN") == [[(5,)]]
        conn.pgconn.exec_(b"COMMIT")
