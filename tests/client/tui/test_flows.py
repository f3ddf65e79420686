"""The TUI driven headless by Textual's Pilot, in local mode and against ``agents serve`` with
a token (over HTTP and gRPC): the README tour's plan from ``/use`` to apply and rollback, a
second client's change appearing live, ids copied, the key map, and a filter."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator

import httpx
import pytest
from textual.widgets import DataTable, Input, RichLog

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.client.tui.plans import PlanScreen, PlansScreen
from cleveragents.acp.client.tui.sessions import SessionScreen, SessionsScreen
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import plan_pb2, session_pb2
from tests.client.tui.helpers import app_on, screen_text, settle, tour, until
from tests.server_process import Children, ServerProcess, Tokens, start_server


def history(app: object) -> list[str]:
    log = app.screen.query_one("#history", RichLog)  # type: ignore[attr-defined]
    return [line.text for line in log.lines]


async def plan_of(client: ACPClient) -> plan_pb2.Plan:
    plans = await client.call("plan.list")
    assert isinstance(plans, plan_pb2.ListPlansResponse)
    assert len(plans.plans) == 1
    return plans.plans[0]


@pytest.fixture
async def clients(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path, children: Children
) -> AsyncIterator[tuple[ACPClient, ACPClient]]:
    """The TUI's client and another one: in process, or to ``agents serve`` with tokens (the
    other client is another principal)."""
    facade = None
    if request.param == "local":
        facade = open_facade(tmp_path / "acp.db")
        made = [ACPClient(LocalTransport(facade)), ACPClient(LocalTransport(facade))]
    else:
        tokens = Tokens.create(tmp_path)
        server = children.server(start_server(tmp_path, tokens=tokens.path, name="tui"))
        made = [connect(request.param, server, tokens.tokens[name]) for name in ("root", "alice")]
    try:
        yield made[0], made[1]
    finally:
        for client in made:
            await client.close()
        if facade is not None:
            await facade.close()


def connect(kind: str, server: ServerProcess, token: str) -> ACPClient:
    if kind == "http":
        http = httpx.AsyncClient(base_url=server.http, timeout=httpx.Timeout(None, connect=5.0))
        return ACPClient(HTTPTransport(http, owns_client=True), token=token)
    return ACPClient(GrpcTransport.connect(server.grpc_target), token=token)


# The tour over gRPC adds nothing the live test over gRPC and the transports' conformance suite
# do not cover, and each server mode costs a server start: HTTP only for the long flow.
@pytest.mark.parametrize("clients", ["local", "http"], indirect=True)
async def test_the_readme_tour_from_use_to_apply_and_rollback(
    clients: tuple[ACPClient, ACPClient], tmp_path: pathlib.Path
) -> None:
    client, _ = clients
    site = await tour(client, tmp_path)
    await client.call("session.create", title="tour", project="demo")
    app = app_on(client)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert isinstance(app.screen, SessionsScreen)
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SessionScreen))
        await pilot.press(*"/use hello name=World", "enter")
        await until(pilot, lambda: any("Started plan" in line for line in history(app)))
        assert app.screen.query_one("#prompt", Input).value == ""
        plan = await plan_of(client)
        await pilot.press("escape", "p")
        await until(
            pilot, lambda: isinstance(app.screen, PlansScreen) and app.screen.query_one(DataTable).row_count
        )
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, PlanScreen))
        # Execute, after a confirmation; the screen follows the plan's events to its end.
        await pilot.press("x")
        await until(pilot, lambda: app.screen.query_one("#question"))
        await pilot.press("y")
        await until(pilot, lambda: "execute/succeeded" in screen_text(app, "#summary"))
        # The mouse works too: a click on the diff's tab.
        await pilot.click("#--content-tab-diff")
        await until(pilot, lambda: "+Hello, World!" in screen_text(app, "#diff-text"))
        await pilot.press("5")
        await until(pilot, lambda: app.screen.query_one("#artifact-table", DataTable).row_count == 1)
        # "n" declines: nothing is applied.
        await pilot.press("a", "n")
        await settle(pilot)
        assert not (site / "hello.txt").exists()
        await pilot.press("a", "y")
        await until(pilot, lambda: "apply/succeeded" in screen_text(app, "#summary"))
        assert (site / "hello.txt").read_text() == "Hello, World!\n"
        await pilot.press("b", "y")
        await until(pilot, lambda: "rolled_back" in screen_text(app, "#summary"))
        assert not (site / "hello.txt").exists()
        await pilot.press("y")
        assert app.clipboard == plan.meta.id


@pytest.mark.parametrize("clients", ["local", "http", "grpc"], indirect=True)
async def test_a_second_clients_change_appears_live(
    clients: tuple[ACPClient, ACPClient], tmp_path: pathlib.Path
) -> None:
    client, other = clients
    await tour(client, tmp_path)
    first = await client.call("session.create", title="first")
    assert isinstance(first, session_pb2.CreateSessionResponse)
    session_id = first.session.meta.id
    await client.call("session.create", title="second")
    app = app_on(client)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        table = app.screen.query_one(DataTable)
        assert table.row_count == 2
        # Another client tells the session: its message count changes in the list, live.
        await other.call("session.tell", session_id=session_id, content="/help")
        row = table.get_row_index(session_id)
        await until(pilot, lambda: table.get_row_at(row)[-1] == "2")
        # The filter: only matching rows; escape goes back to the list; y copies the id.
        await pilot.press("slash", *"first")
        await until(pilot, lambda: table.row_count == 1)
        await pilot.press("escape", "y")
        assert app.clipboard == session_id
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SessionScreen) and len(app.screen.messages) == 2)
        await other.call("session.tell", session_id=session_id, content="/actions")
        await until(pilot, lambda: "user: /actions" in "\n".join(history(app)))
        await until(pilot, lambda: len(app.screen.messages) == 4)  # type: ignore[attr-defined]
        # A plan another client makes appears in the plans list.
        await pilot.press("escape", "p")
        await until(pilot, lambda: isinstance(app.screen, PlansScreen))
        plans = app.screen.query_one(DataTable)
        await settle(pilot)
        assert plans.row_count == 0
        await other.call("plan.use", action="hello", project="demo", inputs={"name": "you"})
        await until(pilot, lambda: plans.row_count == 1)
        await pilot.press("question_mark")
        await until(pilot, lambda: app.screen.query("#keys"))
        keys = screen_text(app, "#keys")
        for text in ("Sessions", "Plans", "Events", "Registries", "Approvals", "Filter", "Copy id", "Quit"):
            assert text in keys
