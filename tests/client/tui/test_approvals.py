"""The approvals inbox driven by Pilot in local mode: the README tour's action under a profile
that asks before ``fs.write``; the pending count in the header of every screen, the request
with its arguments, an answer in the TUI that resumes the plan to its end, and another client's
answer appearing live (and a late answer in the TUI told who decided first)."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator

import pytest
from textual.widgets import DataTable

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.client.tui.approvals import ApprovalsScreen
from cleveragents.acp.client.tui.sessions import SessionsScreen
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import approval_pb2, plan_pb2
from tests.client.tui.helpers import WAIT, app_on, screen_text, settle, tour, until


@pytest.fixture
async def clients(tmp_path: pathlib.Path) -> AsyncIterator[tuple[ACPClient, ACPClient]]:
    facade = open_facade(tmp_path / "acp.db")
    made = ACPClient(LocalTransport(facade)), ACPClient(LocalTransport(facade))
    try:
        yield made
    finally:
        for client in made:
            await client.close()
        await facade.close()


async def careful(client: ACPClient, folder: pathlib.Path) -> None:
    """The tour, and its action again (``careful``) under a profile that asks before every write."""
    await tour(client, folder)
    await client.call("automation_profile.add", name="careful", spec={"approval": {"ask": ["fs.write"]}})
    steps = [
        {"id": "greet", "tool": "fs.write", "args": {"path": "hello.txt", "content": "Hello, {{name}}!\n"}}
    ]
    await client.call(
        "action.add",
        name="careful",
        spec={"actor": "scripted", "steps": steps, "automation_profile": "careful"},
    )


async def waiting_plan(client: ACPClient) -> str:
    used = await client.call("plan.use", action="careful", project="demo", inputs={"name": "World"})
    assert isinstance(used, plan_pb2.UsePlanResponse)
    ran = await client.call("plan.execute", plan_id=used.plan.meta.id, wait=True)
    assert isinstance(ran, plan_pb2.ExecutePlanResponse)
    assert ran.plan.state == plan_pb2.PLAN_STATE_AWAITING_APPROVAL
    return used.plan.meta.id


async def plan_state(client: ACPClient, plan_id: str) -> int:
    status = await client.call("plan.status", plan_id=plan_id)
    assert isinstance(status, plan_pb2.GetPlanStatusResponse)
    return status.plan.state


async def test_answering_in_the_inbox_resumes_the_plan_and_another_clients_answer_shows_live(
    clients: tuple[ACPClient, ACPClient], tmp_path: pathlib.Path
) -> None:
    client, other = clients
    await careful(client, tmp_path)
    first = await waiting_plan(client)
    app = app_on(client)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        # The count is in the header of every screen, from the start.
        assert isinstance(app.screen, SessionsScreen)
        await until(pilot, lambda: app.sub_title == "test · 1 approval pending (i)")
        await pilot.press("i")
        await until(
            pilot,
            lambda: (
                isinstance(app.screen, ApprovalsScreen) and app.screen.query_one(DataTable).row_count == 1
            ),
        )
        shown = screen_text(app, "#approval")
        assert "fs.write arguments:" in shown
        assert '"content": "Hello, World!\\n"' in shown
        assert "asked by  ask: fs.write · step greet" in shown
        # "n" declines: nothing is answered.
        await pilot.press("a", "n")
        await settle(pilot)
        assert await plan_state(client, first) == plan_pb2.PLAN_STATE_AWAITING_APPROVAL
        await pilot.press("a")
        await until(pilot, lambda: "Allow once" in screen_text(app, "#question"))
        await pilot.press("y")
        await until(pilot, lambda: app.sub_title == "test · no approvals pending")
        # The plan resumed and ran its write to the end.
        async with asyncio.timeout(WAIT):
            while await plan_state(client, first) != plan_pb2.PLAN_STATE_SUCCEEDED:
                await pilot.pause(0.02)
        await until(pilot, lambda: app.screen.query_one(DataTable).row_count == 0)

        # Another plan asks: the count and the inbox follow the events; another client answers.
        second = await waiting_plan(other)
        await until(
            pilot,
            lambda: (
                app.sub_title == "test · 1 approval pending (i)"
                and app.screen.query_one(DataTable).row_count == 1
            ),
        )
        screen = app.screen
        assert isinstance(screen, ApprovalsScreen)
        stale = screen.current()
        assert stale is not None
        assert stale.plan_id == second
        await other.call(
            "approval.answer",
            approval_id=stale.id,
            answer=approval_pb2.APPROVAL_ANSWER_REJECT_ONCE,
            reason="not today",
        )
        await until(
            pilot,
            lambda: (
                app.sub_title == "test · no approvals pending" and screen.query_one(DataTable).row_count == 0
            ),
        )
        assert "nothing waits for an answer" in screen_text(app, "#approval")
        # An answer that comes second (the TUI still had the request) is told who decided.
        screen.answer(stale, "allow_once")
        await until(pilot, lambda: "Already decided by" in screen.told)
        assert "(reject_once): your allow_once was not applied" in screen.told
        assert "Already decided by" in screen_text(app, "#status")
        assert await plan_state(client, second) == plan_pb2.PLAN_STATE_FAILED
