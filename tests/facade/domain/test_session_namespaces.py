"""Sessions and context in server mode: a principal sees and touches only its namespaces."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator

import pytest
from google.protobuf import json_format

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.call import Principal
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import session_pb2
from tests.facade.domain.session_helpers import add_project, create, error_of, tell

UNKNOWN_SESSION = "01KC0000000000000000000000"


class TwoTokens:
    """``admin`` may use every namespace, ``team`` only the namespace ``team``."""

    def authenticate(self, token: str | None) -> Principal:
        if token == "admin":
            return Principal("admin", None)
        if token == "team":
            return Principal("team", frozenset({"team"}))
        raise ACPError(ErrorCode.AUTH_REQUIRED, "unknown token")


@pytest.fixture
async def clients(db_path: pathlib.Path) -> AsyncIterator[tuple[ACPClient, ACPClient]]:
    facade = open_facade(db_path, authenticator=TwoTokens())
    yield ACPClient(LocalTransport(facade), token="admin"), ACPClient(LocalTransport(facade), token="team")
    await facade.close()


async def test_a_principal_is_held_to_its_namespaces(
    clients: tuple[ACPClient, ACPClient], tmp_path: pathlib.Path
) -> None:
    admin, team = clients
    await add_project(admin, "web", tmp_path / "web")
    theirs = await create(admin, project="web")
    ours = await create(team, namespace="team", title="ours")

    assert (await error_of(team, "session.create")).code == "AUTH_FORBIDDEN"
    for operation, extra in [
        ("session.show", {}),
        ("session.tell", {"content": "/help"}),
        ("session.resume", {}),
        ("session.export", {}),
        ("session.delete", {}),
        ("context.show", {}),
        ("context.simulate", {}),
    ]:
        # Issue 31, finding 9: as an unknown id answers, naming no namespace.
        err = await error_of(team, operation, session_id=theirs.meta.id, **extra)
        unknown = await error_of(team, operation, session_id=UNKNOWN_SESSION, **extra)
        assert err.code == "NOT_FOUND", operation
        assert err.details == {**unknown.details, "session_id": theirs.meta.id}, operation
        assert err.message == unknown.message.replace(UNKNOWN_SESSION, theirs.meta.id), operation
    assert (await error_of(team, "context.show", project="web")).code == "AUTH_FORBIDDEN"
    assert (await error_of(team, "session.list", namespace="default")).code == "AUTH_FORBIDDEN"

    listed = await team.call("session.list")
    assert isinstance(listed, session_pb2.ListSessionsResponse)
    assert [s.meta.id for s in listed.sessions] == [ours.meta.id]
    everything = await admin.call("session.list")
    assert isinstance(everything, session_pb2.ListSessionsResponse)
    assert [s.meta.id for s in everything.sessions] == [ours.meta.id, theirs.meta.id]

    exported = await admin.call("session.export", session_id=theirs.meta.id)
    assert isinstance(exported, session_pb2.ExportSessionResponse)
    document = json_format.MessageToDict(exported.document)
    err = await error_of(team, "session.import", document=document, new_id=True)
    assert err.code == "AUTH_FORBIDDEN"
    assert (await tell(team, ours.meta.id, "/help")).replies
