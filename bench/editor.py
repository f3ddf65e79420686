"""``agents editor`` (the Zed ACP bridge) against ``ACPClient`` on the same backend.

- ``editor_first_chunk_ms``: a model orchestrator (the test suite's fake OpenAI-compatible
  server, in a thread) answers each prompt in a short stream. Through the bridge (a
  subprocess driven by the Zed ACP SDK's client side over its stdio): the time from sending
  ``session/prompt`` to the first ``agent_message_chunk``. Directly: the time from
  ``session.tell`` (background) to the turn's first ``session.text_delta`` through
  ``ACPClient``, which is what the bridge does for a prompt. The figure is the median of the
  first minus the median of the second, local mode (both on SQLite files of their own) and
  remote (both on one ``agents serve``, over gRPC), the larger of the two.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import statistics
import sys
import time
from typing import Any, cast

from acp import PROTOCOL_VERSION, spawn_agent_process, text_block
from acp.interfaces import Client
from acp.schema import ClientCapabilities, Implementation, RequestPermissionResponse

from bench.product import Product, agents_command
from bench.run import Run
from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.facade.factory import open_facade
from tests.fake_openai import FakeOpenAI, turn

PROMPTS = {"full": 60, "quick": 20, "smoke": 3}
ANSWER = "Looks fine to me; nothing to change."
TURN_EVENTS = ["session.text_delta", "session.turn_completed"]


class _FirstChunk:
    """A Zed ACP client that notes when the first agent text of a prompt arrives."""

    def __init__(self) -> None:
        self.first = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        if getattr(update, "session_update", "") == "agent_message_chunk":
            self.first.set()

    async def request_permission(self, *args: Any, **kwargs: Any) -> RequestPermissionResponse:
        raise RuntimeError("the bench asks no permission")

    def on_connect(self, conn: Any) -> None:
        return None


async def _world(client: ACPClient, folder: pathlib.Path, base_url: str) -> None:
    await client.call("resource.add", name="bench", spec={"type": "directory", "path": str(folder)})
    await client.call("project.add", name="bench", spec={"resources": ["bench"]})
    await client.call(
        "actor.add", name="model", spec={"provider": "openai", "model": "m", "base_url": base_url}
    )


class _Bridge:
    """One ``agents editor`` subprocess with a session, driven by the SDK's client side."""

    def __init__(self, conn: Any, recorder: _FirstChunk, session_id: str) -> None:
        self.conn, self.recorder, self.session_id = conn, recorder, session_id

    async def first_chunk_ms(self) -> float:
        self.recorder.first.clear()
        started = time.perf_counter()
        prompt = asyncio.create_task(
            self.conn.prompt(session_id=self.session_id, prompt=[text_block("Look.")])
        )
        await self.recorder.first.wait()
        elapsed = (time.perf_counter() - started) * 1000
        await prompt
        return elapsed


class _Direct:
    """The same through ``ACPClient``: a background tell, then the turn's events (after the
    last event the previous tell saw, as the bridge reads them)."""

    def __init__(self, client: ACPClient, session_id: str) -> None:
        self.client, self.session_id, self.after = client, session_id, 0

    async def first_chunk_ms(self) -> float:
        started = time.perf_counter()
        told = await self.client.call(
            "session.tell", session_id=self.session_id, content="Look.", background=True
        )
        turn_id = told.turn.id  # type: ignore[attr-defined]
        elapsed = None
        events = self.client.subscribe(
            session_id=self.session_id, event_type=TURN_EVENTS, after_sequence=self.after
        )
        async for event in events:
            self.after = event.sequence
            kind = event.WhichOneof("payload")
            if (
                kind == "session_text_delta"
                and event.session_text_delta.turn_id == turn_id
                and elapsed is None
            ):
                elapsed = (time.perf_counter() - started) * 1000
            if kind == "session_turn_completed" and event.session_turn_completed.turn.id == turn_id:
                break
        if elapsed is None:
            raise RuntimeError("the turn streamed no text")
        return elapsed


async def _interleaved(
    client: ACPClient, command: list[str], env: dict[str, str], folder: pathlib.Path, count: int
) -> tuple[list[float], list[float]]:
    """Bridge and direct prompts taken in turn (the first pair warms up), so a change in the
    machine's load meets both alike."""
    created = await client.call("session.create", project="bench", orchestrator="model")
    direct = _Direct(client, created.session.meta.id)  # type: ignore[attr-defined]
    recorder = _FirstChunk()
    bridged: list[float] = []
    straight: list[float] = []
    async with spawn_agent_process(cast(Client, recorder), *command, env=env, cwd=folder) as (conn, _):
        await conn.initialize(
            protocol_version=PROTOCOL_VERSION,
            client_capabilities=ClientCapabilities(),
            client_info=Implementation(name="bench", title="bench", version="0"),
        )
        session = await conn.new_session(cwd=str(folder), mcp_servers=[])
        bridge = _Bridge(conn, recorder, session.session_id)
        for index in range(count + 1):
            b, d = await bridge.first_chunk_ms(), await direct.first_chunk_ms()
            if index:
                bridged.append(b)
                straight.append(d)
    return bridged, straight


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACP_")}
    env["PYTHONPATH"] = str(pathlib.Path(__file__).resolve().parent.parent)
    return {**env, **extra}


async def _local(run: Run, fake: FakeOpenAI, count: int) -> tuple[list[float], list[float]]:
    """Both in local mode, each on a SQLite file of its own (the bridge's in its process)."""
    folder = run.scratch("editor-local/project")
    bridge_db = run.scratch("editor-local") / "bridge.db"
    facade = open_facade(bridge_db)
    setup = ACPClient(LocalTransport(facade))
    try:
        await _world(setup, folder, fake.base_url)
    finally:
        await setup.close()
        await facade.close()
    facade = open_facade(run.scratch("editor-local") / "direct.db")
    client = ACPClient(LocalTransport(facade))
    try:
        await _world(client, folder, fake.base_url)
        command = [*agents_command(), "editor", "--orchestrator", "model"]
        return await _interleaved(client, command, _env(ACP_DB=str(bridge_db)), folder, count)
    finally:
        await client.close()
        await facade.close()


async def _remote(run: Run, fake: FakeOpenAI, count: int) -> tuple[list[float], list[float]]:
    """Both on one ``agents serve`` over gRPC."""
    folder = run.scratch("editor-remote/project")
    product = Product(run.scratch("editor-remote"), extra=["--model-endpoint", fake.base_url])
    try:
        client = product.client()
        try:
            await _world(client, folder, fake.base_url)
            command = [*agents_command(), "editor", "--orchestrator", "model"]
            env = _env(ACP_GRPC=product.grpc_target, ACP_TOKEN=product.token)
            return await _interleaved(client, command, env, folder, count)
        finally:
            await client.close()
    finally:
        product.stop()


async def first_chunk(run: Run) -> None:
    count = PROMPTS[run.mode.name]
    fake = FakeOpenAI().start_in_thread()
    fake.repeat = turn(ANSWER, pieces=3, tokens=(20, 5))
    try:
        figures = {}
        for where, measure in (("local", _local), ("remote", _remote)):
            bridge, direct = await measure(run, fake, count)
            run.note(f"editor_first_chunk_bridge_{where}_ms", statistics.median(bridge))
            run.note(f"editor_first_chunk_direct_{where}_ms", statistics.median(direct))
            figures[where] = statistics.median(bridge) - statistics.median(direct)
            run.note(f"editor_first_chunk_{where}_ms", figures[where])
    finally:
        fake.stop_thread()
    overhead = max(figures.values())
    if overhead <= 0:
        run.note("editor_first_chunk_below_noise_ms", overhead)
        overhead = 0.001
    run.record("editor_first_chunk_ms", overhead, "zed-acp stdio")


def run_all(run: Run) -> None:
    if sys.platform == "win32":
        raise RuntimeError("the editor family needs POSIX pipes")
    asyncio.run(first_chunk(run))
