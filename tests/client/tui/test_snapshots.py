"""SVG snapshots of every screen at 80x24 and 160x48 (pytest-textual-snapshot), reviewed and
committed under ``__snapshots__/``. The data is the README tour's in local mode (a session whose
``/use`` started a plan, executed so it has a tree, a diff and artifacts); ids and times go
through ``StableDisplay``, so a snapshot does not change from run to run.

After a deliberate change of a screen: ``pytest tests/client/tui/test_snapshots.py
--snapshot-update``, then look at the SVGs (and the report pytest writes) before committing."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Awaitable, Callable

import pytest
from textual.pilot import Pilot
from textual.widgets import DataTable

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.client.tui.app import ACPApp
from cleveragents.acp.client.tui.approvals import ApprovalsScreen
from cleveragents.acp.client.tui.modals import KeysScreen
from cleveragents.acp.client.tui.plans import PlanScreen, PlansScreen
from cleveragents.acp.client.tui.sessions import SessionScreen
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import approval_pb2, plan_pb2, session_pb2
from tests.client.tui.helpers import StableDisplay, settle, tour, until

SIZES = [(80, 24), (160, 48)]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("tui-snapshots")

    async def seed() -> None:
        facade = open_facade(folder / "acp.db")
        client = ACPClient(LocalTransport(facade))
        try:
            await tour(client, folder)
            await client.call("session.create", title="notes")
            made = await client.call("session.create", title="tour", project="demo")
            assert isinstance(made, session_pb2.CreateSessionResponse)
            await client.call(
                "session.tell", session_id=made.session.meta.id, content="/use hello name=World"
            )
            plans = await client.call("plan.list")
            assert isinstance(plans, plan_pb2.ListPlansResponse)
            await client.call("plan.execute", plan_id=plans.plans[0].meta.id, wait=True)
        finally:
            await client.close()
            await facade.close()

    asyncio.run(seed())
    return folder / "acp.db"


@pytest.fixture(scope="module")
def approvals_db(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The tour's action under a profile that asks before a write and before the apply: one
    plan waits for its write, another (written, allowed) for its apply, the newest."""
    folder = tmp_path_factory.mktemp("tui-approvals")

    async def seed() -> None:
        facade = open_facade(folder / "acp.db")
        client = ACPClient(LocalTransport(facade))
        try:
            await tour(client, folder)
            await client.call(
                "automation_profile.add", name="careful", spec={"approval": {"ask": ["fs.write", "apply"]}}
            )
            steps = [
                {"id": "greet", "tool": "fs.write", "args": {"path": "hello.txt", "content": "Hello!\n"}}
            ]
            await client.call(
                "action.add",
                name="careful",
                spec={"actor": "scripted", "steps": steps, "automation_profile": "careful"},
            )
            made = []
            for _ in range(2):
                used = await client.call("plan.use", action="careful", project="demo")
                assert isinstance(used, plan_pb2.UsePlanResponse)
                await client.call("plan.execute", plan_id=used.plan.meta.id, wait=True)
                made.append(used.plan.meta.id)
            listed = await client.call("approval.list", plan_id=made[0])
            assert isinstance(listed, approval_pb2.ListApprovalsResponse)
            await client.call(
                "approval.answer",
                approval_id=listed.approvals[0].id,
                answer=approval_pb2.APPROVAL_ANSWER_ALLOW_ONCE,
            )
            async with asyncio.timeout(30):
                while True:
                    status = await client.call("plan.status", plan_id=made[0])
                    assert isinstance(status, plan_pb2.GetPlanStatusResponse)
                    if status.plan.state == plan_pb2.PLAN_STATE_SUCCEEDED:
                        break
                    await asyncio.sleep(0.02)
            await client.call("plan.apply", plan_id=made[0])
        finally:
            await client.close()
            await facade.close()

    asyncio.run(seed())
    return folder / "acp.db"


def app_for(db: pathlib.Path) -> ACPApp:
    return ACPApp(
        lambda: ACPClient(LocalTransport(open_facade(db)), acp_version=None),
        where="local",
        display=StableDisplay(),
    )


async def ready(pilot: Pilot[None]) -> None:
    await settle(pilot)


async def session(pilot: Pilot[None]) -> None:
    await settle(pilot)
    await pilot.press("enter")
    await until(
        pilot, lambda: isinstance(pilot.app.screen, SessionScreen) and len(pilot.app.screen.messages) == 2
    )
    await settle(pilot)


async def plans(pilot: Pilot[None]) -> None:
    await settle(pilot)
    await pilot.press("p")
    await until(pilot, lambda: isinstance(pilot.app.screen, PlansScreen))
    await settle(pilot)


def plan_tab(key: str) -> Callable[[Pilot[None]], Awaitable[None]]:
    async def run(pilot: Pilot[None]) -> None:
        await plans(pilot)
        await pilot.press("enter")
        await until(
            pilot, lambda: isinstance(pilot.app.screen, PlanScreen) and pilot.app.screen.decisions is not None
        )
        await settle(pilot)
        await pilot.press(key)
        await settle(pilot)

    return run


def mode(key: str) -> Callable[[Pilot[None]], Awaitable[None]]:
    async def run(pilot: Pilot[None]) -> None:
        await settle(pilot)
        await pilot.press(key)
        await settle(pilot)

    return run


async def inbox(pilot: Pilot[None]) -> None:
    await settle(pilot)
    await pilot.press("i")
    await until(
        pilot,
        lambda: (
            isinstance(pilot.app.screen, ApprovalsScreen)
            and pilot.app.screen.query_one("#rows", DataTable).row_count == 2
            and "2 approvals pending" in pilot.app.sub_title
        ),
    )
    await settle(pilot)


async def keys(pilot: Pilot[None]) -> None:
    await plan_tab("1")(pilot)
    await pilot.press("question_mark")
    await until(pilot, lambda: isinstance(pilot.app.screen, KeysScreen))


SCREENS: dict[str, Callable[[Pilot[None]], Awaitable[None]]] = {
    "sessions": ready,
    "session": session,
    "plans": plans,
    "plan_status": plan_tab("1"),
    "plan_tree": plan_tab("2"),
    "plan_diff": plan_tab("3"),
    "plan_explain": plan_tab("4"),
    "plan_artifacts": plan_tab("5"),
    "events": mode("e"),
    "registries": mode("r"),
    "approvals": inbox,
    "keys": keys,
}


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
@pytest.mark.parametrize("screen", list(SCREENS))
def test_screen(
    snap_compare: Callable[..., bool],
    request: pytest.FixtureRequest,
    screen: str,
    size: tuple[int, int],
) -> None:
    # The inbox is shown with requests waiting (a write and an apply); the other screens have none.
    db: pathlib.Path = request.getfixturevalue("approvals_db" if screen == "approvals" else "db")
    assert snap_compare(app_for(db), terminal_size=size, run_before=SCREENS[screen])


def test_no_color(
    snap_compare: Callable[..., bool], db: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With NO_COLOR the diff still reads: its lines keep their + and -, the tree its marks."""
    monkeypatch.setenv("NO_COLOR", "1")
    assert snap_compare(app_for(db), terminal_size=(80, 24), run_before=plan_tab("3"))
