"""Model actors against the fake OpenAI-compatible server of the test suite (served from a
thread of this process, off the measured event loop).

- ``llm_turn_overhead_ms``: what one model turn of a plan costs beyond the model server,
  in-process: the median time of ``plan.use`` + ``plan.execute --wait`` of a plan whose
  model answers in one streamed turn, minus the median of the same for a scripted plan with
  no steps (the plan machinery both share), minus the median of the same streamed answer
  fetched with a bare HTTP client (the fake server's own time and the wire). What is left is
  the openai client, the streamed deltas into the event log, the decision and the charge.
- ``enqueue_overhead_ms``: what the turn queue costs a tell, in-process, with a model
  orchestrator on the fake server: the median time of ``session.tell`` (policy ``enqueue``)
  on a session whose one previous turn has finished (the queue is looked up, the turn waits
  for nothing) minus the median of the same tell on a fresh session (an idle one), interleaved.
- ``delta_event_latency_p99_ms``: the fake server writes a chunk stamped with the time,
  every few milliseconds; a subscriber reads ``plan.text_delta`` frames over SSE from the
  product (``agents serve``, a subprocess) and takes, per stamp, the time from the chunk
  being written to the frame arriving.
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import re
import statistics
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

from bench.load import percentile
from bench.product import Product
from bench.run import Run
from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import plan_pb2, session_pb2
from tests.fake_openai import FakeOpenAI, Stream, chunk, turn

TURNS = {"full": 60, "quick": 20, "smoke": 3}
STAMPS = {"full": 1000, "quick": 300, "smoke": 30}
STAMP_INTERVAL = 0.005
ANSWER = "The project looks fine; nothing needs to change. " * 4
_STAMP = re.compile(r"<t(\d+)>")


def _folder(folder: pathlib.Path) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "README.md").write_text("# Bench\n")
    return folder


async def _world(client: ACPClient, folder: pathlib.Path, base_url: str) -> None:
    await client.call("resource.add", name="bench", spec={"type": "directory", "path": str(folder)})
    await client.call("project.add", name="bench", spec={"resources": ["bench"]})
    actor = {"provider": "openai", "model": "fake-model", "base_url": base_url, "cost_per_1k_tokens": 0.001}
    await client.call("actor.add", name="model", spec=actor)
    await client.call("action.add", name="talk", spec={"actor": "model", "prompt_template": "Look."})
    await client.call("action.add", name="empty", spec={"actor": "scripted", "prompt_template": "Look."})


async def _plan_ms(client: ACPClient, action: str) -> float:
    started = time.perf_counter()
    used = await client.call("plan.use", action=action, project="bench")
    assert isinstance(used, plan_pb2.UsePlanResponse)
    done = await client.call("plan.execute", plan_id=used.plan.meta.id, wait=True)
    assert isinstance(done, plan_pb2.ExecutePlanResponse)
    if done.plan.state != plan_pb2.PLAN_STATE_SUCCEEDED:
        raise RuntimeError(f"bench plan {action} ended {done.plan.state}: {done.plan.last_error.message}")
    return (time.perf_counter() - started) * 1000


async def _raw_ms(http: httpx.AsyncClient, url: str, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    async with http.stream("POST", url, json=body) as response:
        async for _ in response.aiter_lines():
            pass
    return (time.perf_counter() - started) * 1000


async def turn_overhead(run: Run) -> None:
    fake = FakeOpenAI().start_in_thread()
    fake.repeat = turn(ANSWER, pieces=20, tokens=(120, 50))
    facade = open_facade(run.scratch("actors") / "acp.db")
    client = ACPClient(LocalTransport(facade))
    count = TURNS[run.mode.name]
    try:
        await _world(client, _folder(run.scratch("actors/project")), fake.base_url)
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "Look."}], "stream": True}
        async with httpx.AsyncClient(timeout=30) as http:
            url = f"{fake.base_url}/chat/completions"
            await _raw_ms(http, url, body)
            await _plan_ms(client, "talk")
            await _plan_ms(client, "empty")
            raw, model, scripted = [], [], []
            # Interleaved, so a burst of other work on the machine hits all three alike.
            for _ in range(count):
                raw.append(await _raw_ms(http, url, body))
                model.append(await _plan_ms(client, "talk"))
                scripted.append(await _plan_ms(client, "empty"))
    finally:
        await client.close()
        await facade.close()
        fake.stop_thread()
    overhead = statistics.median(model) - statistics.median(scripted) - statistics.median(raw)
    run.note("llm_turn_model_plan_ms", statistics.median(model))
    run.note("llm_turn_scripted_plan_ms", statistics.median(scripted))
    run.note("llm_turn_raw_http_ms", statistics.median(raw))
    if overhead <= 0:
        # Below the noise of this run (a shared machine): the difference itself is kept beside.
        run.note("llm_turn_overhead_below_noise_ms", overhead)
        overhead = 0.001
    run.record("llm_turn_overhead_ms", overhead, "in-process")


async def _tell_ms(client: ACPClient, session_id: str) -> float:
    started = time.perf_counter()
    told = await client.call(
        "session.tell", session_id=session_id, content="Look.", multitask="MULTITASK_POLICY_ENQUEUE"
    )
    assert isinstance(told, session_pb2.TellSessionResponse)
    if told.turn.state != session_pb2.TURN_STATE_SUCCEEDED:
        raise RuntimeError(f"bench turn ended {told.turn.state}: {told.turn.error.message}")
    return (time.perf_counter() - started) * 1000


async def _fresh_session(client: ACPClient) -> str:
    created = await client.call("session.create", orchestrator="model")
    assert isinstance(created, session_pb2.CreateSessionResponse)
    return created.session.meta.id


async def enqueue_overhead(run: Run) -> None:
    fake = FakeOpenAI().start_in_thread()
    fake.repeat = turn("Fine.", pieces=2, tokens=(20, 5))
    facade = open_facade(run.scratch("turns") / "acp.db")
    client = ACPClient(LocalTransport(facade))
    count = TURNS[run.mode.name]
    try:
        await _world(client, _folder(run.scratch("turns/project")), fake.base_url)
        idle, queued = [], []
        for _ in range(count + 1):
            # Sessions made (and the first turn told) outside the measured time; the queued
            # tell's session holds one finished turn, so the histories differ by one exchange.
            fresh, behind = await _fresh_session(client), await _fresh_session(client)
            await _tell_ms(client, behind)
            idle.append(await _tell_ms(client, fresh))
            queued.append(await _tell_ms(client, behind))
        # The first pair warms the paths up.
        idle, queued = idle[1:], queued[1:]
    finally:
        await client.close()
        await facade.close()
        fake.stop_thread()
    run.note("enqueue_idle_tell_ms", statistics.median(idle))
    run.note("enqueue_queued_tell_ms", statistics.median(queued))
    overhead = statistics.median(queued) - statistics.median(idle)
    if overhead <= 0:
        run.note("enqueue_overhead_below_noise_ms", overhead)
        overhead = 0.001
    run.record("enqueue_overhead_ms", overhead, "in-process")


def _stamped(count: int) -> Stream:
    """A streamed answer whose every chunk carries the time it is written (``{now}``)."""
    pieces: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": ""})]
    pieces.extend(json.dumps(chunk({"content": "<t{now}> "})) for _ in range(count))
    pieces.append(chunk({}, "stop"))
    return Stream(pieces, delay=STAMP_INTERVAL)


async def _read_stamps(url: str, headers: dict[str, str], wanted: int, seconds: float) -> list[float]:
    """Latencies (ms) of the stamps in plan.text_delta frames of one SSE stream."""
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    head = f"GET {parts.path}?{parts.query} HTTP/1.1\r\nHost: {parts.netloc}\r\nAccept: text/event-stream\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write((head + "\r\n").encode())
    latencies: list[float] = []
    try:
        async with asyncio.timeout(seconds):
            await reader.readuntil(b"\r\n\r\n")
            while len(latencies) < wanted:
                line = await reader.readline()
                if not line:
                    break
                now = time.perf_counter_ns()
                if line.startswith(b"data:"):
                    latencies.extend((now - int(s)) / 1e6 for s in _STAMP.findall(line.decode()))
    except TimeoutError:
        pass
    finally:
        writer.close()
    return latencies


async def delta_latency(run: Run) -> None:
    wanted = STAMPS[run.mode.name]
    fake = FakeOpenAI().start_in_thread()
    # Server mode: model actors reach only the endpoints the operator lists.
    product = Product(run.scratch("actors-sse"), extra=["--model-endpoint", fake.base_url])
    try:
        client = product.client()
        try:
            await _world(client, _folder(run.scratch("actors-sse/project")), fake.base_url)
            fake.then(_stamped(wanted))
            used = await client.call("plan.use", action="talk", project="bench")
            assert isinstance(used, plan_pb2.UsePlanResponse)
            plan_id = used.plan.meta.id
            url = f"{product.http_url}/api/v1/events/stream?plan_id={plan_id}&event_type=plan.text_delta"
            reading = asyncio.create_task(
                _read_stamps(url, product.auth_header, wanted, run.mode.stream_timeout)
            )
            await asyncio.sleep(0.5)
            await client.call("plan.execute", plan_id=plan_id)
            latencies = await reading
        finally:
            await client.close()
    finally:
        product.stop()
        fake.stop_thread()
    if not latencies:
        raise RuntimeError("no plan.text_delta frame arrived")
    run.note("delta_event_latency_p50_ms", percentile(latencies, 50))
    run.note("delta_event_stamps", len(latencies))
    run.record("delta_event_latency_p99_ms", percentile(latencies, 99), "sse")


def run_all(run: Run) -> None:
    asyncio.run(turn_overhead(run))
    asyncio.run(enqueue_overhead(run))
    asyncio.run(delta_latency(run))
