"""Streaming conformance over the local iterator, gRPC streaming and SSE (through the
envelope gateway, the REST client and the gateway-only server): filters, causal order
within a plan, resume after a dropped connection with nothing lost or repeated, a stalled
subscriber ended without slowing others, keep-alives on an idle SSE stream. A tell is a turn
(ACP 1.3): its two messages between ``session.turn_started`` and ``session.turn_completed``; a
subscriber speaking 1.2 gets the same stream without the turn events."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest

from cleveragents.acp.contract import sse
from cleveragents.acp.v1 import events_pb2, plan_pb2
from tests.conformance.backends import KINDS, open_backend
from tests.conformance.envelopes import frame_problems
from tests.conformance.harness import COVERAGE, Run, run_everywhere
from tests.conformance.scenarios import plan_world, use
from tests.server_process import Tokens

# The events of a plan from use to apply, in the order they must arrive.
CAUSAL = [
    "plan.created",
    "plan.state_changed",  # strategize: pending -> running
    "plan.decision_made",
    "plan.state_changed",  # strategize: -> succeeded
    "plan.phase_changed",  # -> execute
    "plan.state_changed",  # execute: -> running
    *["tool.invoked", "tool.completed"] * 3,
    "plan.state_changed",  # execute: -> succeeded
    "plan.phase_changed",  # -> apply
    "plan.state_changed",  # apply: -> running
    "plan.apply_completed",
    "plan.state_changed",  # apply: -> succeeded
]


# The events of a (synchronous) tell, as a subscriber of the current minor and one of 1.2 see them.
TELL = ["session.turn_started", "session.message", "session.message", "session.turn_completed"]
TURNS = {"session.turn_started", "session.turn_completed"}
TELL_1_2 = [t for t in TELL if t not in TURNS]
PRIOR = "1.2"


def applied(event: events_pb2.Event) -> bool:
    change = event.plan_state_changed
    return change.phase == plan_pb2.PLAN_PHASE_APPLY and change.to_state == plan_pb2.PLAN_STATE_SUCCEEDED


async def take_until(
    stream: AsyncIterator[events_pb2.Event], done: Any, seconds: float = 10
) -> list[events_pb2.Event]:
    found: list[events_pb2.Event] = []
    async with asyncio.timeout(seconds):
        while not found or not done(found[-1]):
            found.append(await anext(stream))
    return found


def collapsed(types: list[str]) -> list[str]:
    """Types with runs of decisions (one per node) counted once."""
    return [t for i, t in enumerate(types) if t != "plan.decision_made" or types[i - 1] != t]


async def take(
    stream: AsyncIterator[events_pb2.Event], count: int, seconds: float = 10
) -> list[events_pb2.Event]:
    found: list[events_pb2.Event] = []
    async with asyncio.timeout(seconds):
        while len(found) < count:
            found.append(await anext(stream))
    return found


async def tell_many(run: Run, session_id: str, count: int, size: int = 10, start: int = 0) -> None:
    client = run.client()
    for index in range(start, start + count):
        await client.call("session.tell", session_id=session_id, content=f"{index:04d}" + "x" * size)
        # A real producer yields between calls; local calls alone never would.
        await asyncio.sleep(0)


def sequences(events: list[events_pb2.Event]) -> list[int]:
    return [e.sequence for e in events]


async def live_filters_and_causal_order(run: Run) -> None:
    """Subscribers attached before anything happens get live events, filtered, in order."""
    alice, root = run.client(), run.client("root")
    await plan_world(run)
    session = await alice.call("session.create", project="proj")
    session_id = session.session.meta.id  # type: ignore[attr-defined]
    everything = aiter(root.subscribe())
    # Reading an event proves the subscription attached: the plan's events then arrive live.
    await alice.call("session.tell", session_id=session_id, content="/help")
    assert [e.type for e in await take(everything, len(TELL))] == TELL
    tools = aiter(alice.subscribe(event_type=["tool.invoked", "tool.completed"]))
    of_session = aiter(alice.subscribe(session_id=session_id))
    of_session_1_2 = aiter(run.client(acp_version=PRIOR).subscribe(session_id=session_id))
    theirs = aiter(run.client("bob").subscribe())
    plan_id = await use(alice, session_id=session_id)
    await alice.call("plan.execute", plan_id=plan_id, wait=True)
    await alice.call("plan.apply", plan_id=plan_id)
    await alice.call("session.tell", session_id=session_id, content="/help")
    await run.client("bob").call("session.create", namespace="other")
    plan_events = await take_until(everything, applied)
    assert collapsed([e.type for e in plan_events]) == CAUSAL
    assert sequences(plan_events) == sorted(sequences(plan_events))
    assert {e.plan_id for e in plan_events} == {plan_id}
    phases = [
        (e.plan_state_changed.phase, e.plan_state_changed.to_state)
        for e in plan_events
        if e.plan_state_changed.phase
    ]
    assert phases[-1] == (plan_pb2.PLAN_PHASE_APPLY, plan_pb2.PLAN_STATE_SUCCEEDED)
    assert [e.type for e in await take(tools, 6)] == ["tool.invoked", "tool.completed"] * 3
    session_events = await take(of_session, len(plan_events) + 2 * len(TELL))
    assert {e.session_id for e in session_events} == {session_id}
    assert [e.type for e in session_events[: len(TELL)]] == TELL
    assert [e.sequence for e in session_events[len(TELL) : -len(TELL)]] == sequences(plan_events)
    assert [e.type for e in session_events[-len(TELL) :]] == TELL
    # A 1.2 subscriber: the same events without the turns'.
    older = await take(of_session_1_2, len(plan_events) + 2 * len(TELL_1_2))
    assert [e.type for e in older] == TELL_1_2 + [e.type for e in plan_events] + TELL_1_2
    assert sequences(older) == [e.sequence for e in session_events if e.type not in TURNS]
    # bob sees nothing of `default`; the first event he may see is none of alice's.
    with pytest.raises(TimeoutError):
        await take(theirs, 1, seconds=0.3)
    for stream in (everything, tools, of_session, of_session_1_2, theirs):
        await stream.aclose()  # type: ignore[attr-defined]


async def test_live_filters_and_causal_order_are_the_same_everywhere(
    tmp_path: pathlib.Path, tokens: Tokens
) -> None:
    await run_everywhere(live_filters_and_causal_order, tmp_path, tokens)


@pytest.mark.parametrize("kind", KINDS)
async def test_resume_after_a_dropped_connection(kind: str, tmp_path: pathlib.Path, tokens: Tokens) -> None:
    async with open_backend(kind, tmp_path, tokens) as backend:
        run = Run(backend)
        # A subscriber of the current minor and one of 1.2 (no turn events), each dropped
        # in the middle of a tell.
        clients = {"current": run.client(), "prior": run.client(acp_version=PRIOR)}
        per_tell = {"current": len(TELL), "prior": len(TELL_1_2)}
        session = await clients["current"].call("session.create")
        session_id = session.session.meta.id  # type: ignore[attr-defined]
        streams = {who: aiter(c.subscribe(session_id=session_id)) for who, c in clients.items()}
        await tell_many(run, session_id, 5)
        first = {who: await take(streams[who], 3 * per_tell[who] + 2) for who in clients}
        for stream in streams.values():
            await stream.aclose()  # type: ignore[attr-defined]  # the connection drops
        await tell_many(run, session_id, 5, start=5)
        seen: dict[str, list[events_pb2.Event]] = {}
        for who, c in clients.items():
            resumed = aiter(c.subscribe(session_id=session_id, after_sequence=first[who][-1].sequence))
            rest = await take(resumed, 10 * per_tell[who] - len(first[who]))
            with pytest.raises(TimeoutError):
                await take(resumed, 1, seconds=0.3)
            await resumed.aclose()  # type: ignore[attr-defined]
            seen[who] = first[who] + rest
            told = [
                e.session_message.message.content[:4]
                for e in seen[who]
                if e.type == "session.message" and e.session_message.message.index % 2 == 0
            ]
            assert told == [f"{i:04d}" for i in range(10)], who
        current = sequences(seen["current"])
        assert current == list(range(current[0], current[0] + 40)), "nothing lost or repeated"
        assert [e.type for e in seen["current"]] == TELL * 10
        assert [e.type for e in seen["prior"]] == TELL_1_2 * 10
        assert sequences(seen["prior"]) == [e.sequence for e in seen["current"] if e.type not in TURNS]


async def sse_frames(response: Any) -> AsyncIterator[sse.Event]:
    parser = sse.Parser()
    async for line in response.aiter_lines():
        if line.startswith(":"):
            yield sse.Event(event=":", data=line)
        for event in parser.feed(line.rstrip("\r")):
            yield event


async def sse_resumed(
    http: Any, session_id: str, headers: dict[str, str], last_event_id: str | None, count: int
) -> list[sse.Event]:
    """The first ``count`` events of a stream resumed after ``last_event_id``."""
    resumed: list[sse.Event] = []
    async with http.stream(
        "GET",
        "/api/v1/events/stream",
        params={"session_id": session_id},
        headers={**headers, "Last-Event-ID": str(last_event_id)},
    ) as response:
        frames = sse_frames(response)
        async with asyncio.timeout(10):
            while len(resumed) < count:
                frame = await anext(frames)
                if frame.event != ":":
                    assert frame_problems(frame.event, frame.data) == []
                    resumed.append(frame)
    return resumed


async def test_sse_resumes_from_last_event_id_and_keeps_idle_streams_alive(
    tmp_path: pathlib.Path, tokens: Tokens
) -> None:
    async with open_backend("http", tmp_path, tokens, keepalive_seconds=0.2) as backend:
        run = Run(backend)
        session = await run.client().call("session.create")
        session_id = session.session.meta.id  # type: ignore[attr-defined]
        await tell_many(run, session_id, 3)
        auth = {"Authorization": f"Bearer {tokens.tokens['alice']}"}
        async with backend.http_client() as http:
            received: list[sse.Event] = []
            comments: list[str] = []
            async with http.stream(
                "GET", "/api/v1/events/stream", params={"session_id": session_id}, headers=auth
            ) as response:
                frames = sse_frames(response)
                async with asyncio.timeout(10):
                    while len(received) < 3 * len(TELL) or len(comments) < 3:
                        frame = await anext(frames)
                        if frame.event == ":":
                            comments.append(frame.data)
                        else:
                            received.append(frame)
                            assert frame_problems(frame.event, frame.data) == []
            assert comments[0] == ": stream open"
            assert comments.count(": keep-alive") >= 2, comments
            assert [f.event for f in received] == TELL * 3
            await tell_many(run, session_id, 2, start=3)
            # From the end of the second tell; a 1.2 reader (ACP-Version) gets no turn events.
            kept = 2 * len(TELL)
            resumed = await sse_resumed(http, session_id, auth, received[kept - 1].id, 3 * len(TELL))
            ids = [int(f.id or 0) for f in received[:kept] + resumed]
            assert ids == list(range(ids[0], ids[0] + 5 * len(TELL)))
            assert [f.event for f in resumed] == TELL * 3
            assert orjson.loads(resumed[-3].data)["session_message"]["message"]["content"].startswith("0004")
            older = {**auth, "ACP-Version": PRIOR}
            prior = await sse_resumed(http, session_id, older, received[kept - 1].id, 3 * len(TELL_1_2))
            assert [f.event for f in prior] == TELL_1_2 * 3
            assert [f.id for f in prior] == [f.id for f in resumed if f.event not in TURNS]
        assert backend.envelopes.problems == []


# Liveness bounds, not speed: on a busy 2-core box 360 events of 99 kB take half a minute.
SLOW_BOUND_SECONDS = 120


@pytest.mark.timeout(4 * SLOW_BOUND_SECONDS)
@pytest.mark.parametrize("kind", KINDS)
async def test_a_stalled_subscriber_is_ended_without_slowing_others(
    kind: str, tmp_path: pathlib.Path, tokens: Tokens, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stalled one reads nothing while big events pass; it is ended after what it had
    queued (BUDGET_EXCEEDED, SUBSCRIBER_TOO_SLOW, the last sequence it got) and resumes from
    there with nothing lost. The other reads every event as it comes."""
    monkeypatch.setenv("ACP_EVENT_QUEUE_SIZE", "16")
    count, size = 180, 99_000
    async with open_backend(kind, tmp_path, tokens) as backend:
        run = Run(backend)
        alice = run.client()
        session = await alice.call("session.create")
        session_id = session.session.meta.id  # type: ignore[attr-defined]
        stalled = aiter(alice.subscribe(session_id=session_id))
        reader = aiter(alice.subscribe(session_id=session_id))
        await tell_many(run, session_id, 1)
        # Each has read an event, so each is attached; the stalled one reads no more.
        got = await take(stalled, 1)
        first = await take(reader, 1)
        everything = len(TELL) * (count + 1)
        reading = asyncio.ensure_future(take(reader, everything - 1, seconds=SLOW_BOUND_SECONDS))
        # A producer held back by the stalled subscriber would never finish; how fast it
        # finishes is the benchmark's business, not an assertion here.
        async with asyncio.timeout(SLOW_BOUND_SECONDS):
            await tell_many(run, session_id, count, size, start=1)
        fast = first + await reading
        assert sequences(fast) == list(range(fast[0].sequence, fast[0].sequence + everything))
        err = await Run.fails(_drain(stalled, got), "BUDGET_EXCEEDED", "SUBSCRIBER_TOO_SLOW")
        assert err.details["last_sequence"] == got[-1].sequence
        assert len(got) < len(fast)
        resumed = aiter(alice.subscribe(session_id=session_id, after_sequence=got[-1].sequence))
        rest = await take(resumed, len(fast) - len(got), seconds=SLOW_BOUND_SECONDS)
        await resumed.aclose()  # type: ignore[attr-defined]
        await reader.aclose()  # type: ignore[attr-defined]
        assert sequences(got + rest) == sequences(fast)
    COVERAGE.passed.add(f"streaming:slow:{kind}")


async def _drain(stream: AsyncIterator[events_pb2.Event], into: list[events_pb2.Event]) -> None:
    async with asyncio.timeout(SLOW_BOUND_SECONDS):
        async for event in stream:
            into.append(event)
