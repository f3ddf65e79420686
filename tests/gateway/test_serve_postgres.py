"""``agents serve --db postgresql://...`` as a process: a session and a plan driven through
it over HTTP, the banner without the password, a restart that finds everything, local mode
selecting the same database by ``ACP_DB``, and an unreachable database as one line."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
from collections.abc import AsyncIterator

import httpx
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.v1 import plan_pb2, session_pb2
from tests import postgres
from tests.facade.plans import helpers
from tests.server_process import ServerProcess, Tokens, agents_command, start_server

CALL_TIMEOUT = 60.0


def with_password(url: str) -> str:
    """The test URL with a password in it (trust auth ignores it): the banner must hide it."""
    return url.replace("://postgres@", "://postgres:s3cret-pw@", 1)


@pytest.fixture
async def client_for() -> AsyncIterator[list[ACPClient]]:
    made: list[ACPClient] = []
    yield made
    for client in made:
        await client.close()


def connect(server: ServerProcess, token: str, made: list[ACPClient]) -> ACPClient:
    http = httpx.AsyncClient(base_url=server.http, timeout=CALL_TIMEOUT)
    made.append(ACPClient(HTTPTransport(http, owns_client=True), token=token))
    return made[-1]


async def test_serve_on_postgres_runs_a_session_and_a_plan_and_keeps_them(
    tmp_path: pathlib.Path, pg_url: str, client_for: list[ACPClient]
) -> None:
    if not pg_url.startswith("postgresql://postgres@"):
        pytest.skip("the password check needs the default test URL")
    url = with_password(pg_url)
    tokens = Tokens.create(tmp_path)
    project = tmp_path / "project"
    helpers.write_tree(project)
    server = start_server(tmp_path, "--db", url, tokens=tokens.path, roots=[tmp_path])
    try:
        banner = "\n".join(server.stdout)
        store_line = next(line for line in server.stdout if line.strip().startswith("store"))
        assert "postgresql://postgres:***@127.0.0.1" in store_line
        assert "s3cret-pw" not in banner
        client = connect(server, tokens.tokens["alice"], client_for)
        created = await client.call("session.create", namespace="default", title="on postgres")
        assert isinstance(created, session_pb2.CreateSessionResponse)
        session_id = created.session.meta.id
        await client.call("session.tell", session_id=session_id, content="hello")
        await client.call("session.tell", session_id=session_id, content="again")
        await helpers.add_project(client, project)
        await helpers.add_action(client)
        plan = await helpers.use(client)
        ran = await helpers.run(client, plan.meta.id)
        assert (ran.phase, ran.state) == (plan_pb2.PLAN_PHASE_EXECUTE, plan_pb2.PLAN_STATE_SUCCEEDED)
        await client.call("plan.apply", plan_id=plan.meta.id)
        assert (project / "docs/guide.md").read_text() == "# The guide\n"
        assert not (project / "obsolete.txt").exists()
    finally:
        assert server.stop() == 0, server.stderr()

    # Another server on the same database (as a replica restarting) finds all of it.
    again = start_server(tmp_path, "--db", url, tokens=tokens.path, roots=[tmp_path], name="again")
    try:
        client = connect(again, tokens.tokens["alice"], client_for)
        shown = await client.call("session.show", session_id=session_id)
        assert isinstance(shown, session_pb2.GetSessionResponse)
        told = [m.content for m in shown.messages if m.role == session_pb2.MESSAGE_ROLE_USER]
        assert told == ["hello", "again"]
        assert [m.index for m in shown.messages] == list(range(len(shown.messages)))
        status = await helpers.status(client, plan.meta.id)
        assert (status.phase, status.state) == (plan_pb2.PLAN_PHASE_APPLY, plan_pb2.PLAN_STATE_SUCCEEDED)
    finally:
        assert again.stop() == 0, again.stderr()

    # Local mode selects the same database by ACP_DB.
    listed = await asyncio.to_thread(
        subprocess.run,
        agents_command("session", "list", "--json"),
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "ACP_DB": url},
    )
    assert listed.returncode == 0, listed.stderr
    assert session_id in {s["meta"]["id"] for s in json.loads(listed.stdout)["sessions"]}


def test_an_unreachable_database_is_one_line_without_the_password(tmp_path: pathlib.Path) -> None:
    postgres.need()
    tokens = Tokens.create(tmp_path)
    result = subprocess.run(
        agents_command(
            "serve",
            "--db",
            "postgresql://me:s3cret-pw@127.0.0.1:1/acp?connect_timeout=3",
            "--tokens",
            str(tokens.path),
            "--http-port",
            "0",
            "--grpc-port",
            "0",
        ),
        capture_output=True,
        text=True,
        timeout=CALL_TIMEOUT,
        check=False,
        cwd=tmp_path,
    )
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "s3cret-pw" not in result.stderr + result.stdout
    assert "cannot open the store postgresql://me:***@127.0.0.1:1/acp" in result.stderr
