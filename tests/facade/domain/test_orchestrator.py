"""The built-in orchestrator's ``/use``: argument parsing, and starting plans through a PlanStarter."""

from __future__ import annotations

import pathlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from ulid import ULID

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.context.service import Context
from cleveragents.acp.facade.domain.events.log import EventLog
from cleveragents.acp.facade.domain.orchestrators.builtin import PlanStarter, UseArgumentError, parse_use
from cleveragents.acp.facade.domain.registries import KINDS, Registries
from cleveragents.acp.facade.domain.registries.verbs import RegistryVerbs
from cleveragents.acp.facade.domain.sessions import records as session_records
from cleveragents.acp.facade.domain.sessions.service import Sessions
from cleveragents.acp.facade.handlers import table
from cleveragents.acp.facade.handlers.registries import RegistryHandlers
from cleveragents.acp.facade.handlers.sessions import SessionHandlers
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import common_pb2, plan_pb2
from tests.facade.domain.session_helpers import add_project, create, tell


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ("bump", ("bump", {})),
        ("bump level=2 dry=true name=release", ("bump", {"level": 2, "dry": True, "name": "release"})),
        ("bump note='{\"a\": [1, null]}'", ("bump", {"note": {"a": [1, None]}})),
        ('bump title="two words" empty=', ("bump", {"title": "two words", "empty": ""})),
        ("bump ratio=0.5 big=1e999 nan=NaN", ("bump", {"ratio": 0.5, "big": "1e999", "nan": "NaN"})),
        ("bump s='\"quoted\"'", ("bump", {"s": "quoted"})),
        ("  bump\tx-y=1  ", ("bump", {"x-y": 1})),
    ],
)
def test_parse_use(arguments: str, expected: tuple[str, dict[str, Any]]) -> None:
    assert parse_use(arguments) == expected


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ("", "name the action"),
        ("a=1", "must be the action name"),
        ("bump level", "is not key=value"),
        ("bump =1", "is not a valid input name"),
        ("bump 9x=1", "is not a valid input name"),
        ("bump a=1 a=2", "given twice"),
        ("bump note='open", "cannot split"),
    ],
)
def test_parse_use_refuses(arguments: str, problem: str) -> None:
    with pytest.raises(UseArgumentError, match=problem):
        parse_use(arguments)


class RecordingPlanStarter:
    """A PlanStarter standing in for the plan engine: records what it is asked to start."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

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
        if action == "missing":
            raise ACPError(ErrorCode.NOT_FOUND, f"no action {action!r}", refinement="ACTION_NOT_FOUND")
        self.calls.append(
            {
                "namespace": namespace,
                "action": action,
                "project": project,
                "session_id": session_id,
                "inputs": inputs,
            }
        )
        return plan_pb2.Plan(
            meta=common_pb2.EntityMeta(id=str(ULID()), namespace=namespace),
            action=action,
            project=project,
            session_id=session_id,
            phase=plan_pb2.PLAN_PHASE_STRATEGIZE,
            state=plan_pb2.PLAN_STATE_PENDING,
        )


@pytest.fixture
def starter() -> RecordingPlanStarter:
    return RecordingPlanStarter()


async def _sessions_client(db_path: pathlib.Path, starter: PlanStarter | None) -> AsyncIterator[ACPClient]:
    """A client whose sessions start plans through ``starter`` (or cannot start any)."""
    store = SQLiteStore(db_path)
    events = EventLog(store)
    registries = Registries(store)
    context = Context(store, registries, session_records.load)
    sessions = Sessions(store, registries, events, context, plan_starter=starter)
    served = [op.name for op in catalog.OPERATIONS.values() if op.group == "session" or op.group in KINDS]
    handlers = [SessionHandlers(sessions), RegistryHandlers(RegistryVerbs(registries))]
    facade = ServiceFacade(table.build(handlers, serves=served))
    yield ACPClient(LocalTransport(facade))
    events.close()
    store.close()


@pytest.fixture
async def planning_client(db_path: pathlib.Path, starter: RecordingPlanStarter) -> AsyncIterator[ACPClient]:
    async for client in _sessions_client(db_path, starter):
        yield client


@pytest.fixture
async def planless_client(db_path: pathlib.Path) -> AsyncIterator[ACPClient]:
    async for client in _sessions_client(db_path, None):
        yield client


async def test_use_without_a_plan_engine_says_so(planless_client: ACPClient, tmp_path: pathlib.Path) -> None:
    await add_project(planless_client, "web", tmp_path / "web")
    session = await create(planless_client, project="web")
    reply = (await tell(planless_client, session.meta.id, "/use bump level=2")).replies[0]
    assert reply.content.startswith("Plans are not available on this server")
    assert reply.plan_id == ""
    bad = (await tell(planless_client, session.meta.id, "/use")).replies[0].content
    assert "name the action to use" in bad


async def test_use_starts_a_plan(
    planning_client: ACPClient, starter: RecordingPlanStarter, tmp_path: pathlib.Path
) -> None:
    await add_project(planning_client, "web", tmp_path / "web")
    session = await create(planning_client, project="web")
    told = await tell(planning_client, session.meta.id, "/use bump level=2 note='{\"x\": 1}'")
    (reply,) = told.replies
    assert reply.plan_id
    assert reply.content.startswith(f"Started plan {reply.plan_id} from action 'bump' on project 'web'")
    assert f"Run it with `agents plan execute {reply.plan_id} --wait`" in reply.content
    assert "phase strategize, state pending" in reply.content
    assert starter.calls == [
        {
            "namespace": "default",
            "action": "bump",
            "project": "web",
            "session_id": session.meta.id,
            "inputs": {"level": 2, "note": {"x": 1}},
        }
    ]


async def test_use_reports_what_stops_it(
    planning_client: ACPClient, starter: RecordingPlanStarter, tmp_path: pathlib.Path
) -> None:
    no_project = await create(planning_client)
    reply = (await tell(planning_client, no_project.meta.id, "/use bump")).replies[0]
    assert "This session has no project" in reply.content
    await add_project(planning_client, "web", tmp_path / "web")
    session = await create(planning_client, project="web")
    refused = (await tell(planning_client, session.meta.id, "/use missing")).replies[0]
    assert refused.content == "Could not start a plan from action 'missing': NOT_FOUND: no action 'missing'"
    assert refused.plan_id == ""
    malformed = (await tell(planning_client, session.meta.id, "/use bump level")).replies[0]
    assert "'level' is not key=value" in malformed.content
    assert starter.calls == []
