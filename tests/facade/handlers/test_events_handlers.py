"""events.subscribe through the facade and ``ACPClient`` over ``LocalTransport``."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, cast

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract import catalog, versions
from cleveragents.acp.contract.call import CallContext, Principal
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.events.log import EVENT_TYPES, EventLog
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.handlers import table
from cleveragents.acp.facade.handlers.events import EventHandlers
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import events_pb2
from tests.facade.plans.helpers import eventually

TIMEOUT = 10.0


class OnlyNamespaceA:
    """A real authenticator: one token, one namespace."""

    def authenticate(self, token: str | None) -> Principal:
        if token != "t-a":
            raise ACPError("AUTH_REQUIRED", "bad token")
        return Principal("alice", frozenset({"a"}))


@pytest.fixture
def store(db_path: pathlib.Path) -> Iterator[SQLiteStore]:
    store = SQLiteStore(db_path)
    yield store
    store.close()


@pytest.fixture
def log(store: SQLiteStore) -> Iterator[EventLog]:
    log = EventLog(store, queue_size=32)
    yield log
    log.close()


@pytest.fixture
async def events_client(log: EventLog) -> AsyncIterator[ACPClient]:
    async with ACPClient(LocalTransport(ServiceFacade(events_table(log)), owns_facade=True)) as client:
        yield client


def events_table(log: EventLog) -> Mapping[str, table.Handler]:
    return table.build([EventHandlers(log)], serves=["events.subscribe", "events.ticket"])


def message(namespace: str = "default", session_id: str = "s1", text: str = "hi") -> events_pb2.Event:
    return events_pb2.Event(
        namespace=namespace,
        session_id=session_id,
        log_record=events_pb2.LogRecord(level="info", message=text),
    )


def tool(plan_id: str, namespace: str = "default") -> events_pb2.Event:
    return events_pb2.Event(
        namespace=namespace, plan_id=plan_id, tool_invoked=events_pb2.ToolInvoked(tool="file.read")
    )


@asynccontextmanager
async def opened(
    client: ACPClient, params: Any = None, **fields: Any
) -> AsyncIterator[AsyncIterator[events_pb2.Event]]:
    """A subscription closed (and detached from the log) when the block ends."""
    stream = cast(AsyncGenerator[events_pb2.Event, None], client.subscribe(params, **fields))
    try:
        yield stream
    finally:
        await stream.aclose()


async def first_event(client: ACPClient, **fields: Any) -> events_pb2.Event:
    async with opened(client, **fields) as stream:
        return await asyncio.wait_for(anext(stream), TIMEOUT)


async def refused(client: ACPClient, **fields: Any) -> ACPError:
    with pytest.raises(ACPError) as info:
        await first_event(client, **fields)
    return info.value


async def take(stream: AsyncIterator[events_pb2.Event], count: int) -> list[events_pb2.Event]:
    async def read() -> list[events_pb2.Event]:
        return [await anext(stream) for _ in range(count)]

    return await asyncio.wait_for(read(), TIMEOUT)


async def nothing_more(stream: AsyncIterator[events_pb2.Event]) -> None:
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(anext(stream), 0.05)


async def test_backlog_then_live(events_client: ACPClient, log: EventLog) -> None:
    log.publish_many([message(text="one"), message(text="two")])
    async with opened(events_client) as stream:
        first = await take(stream, 2)
        assert [(e.sequence, e.type, e.log_record.message) for e in first] == [
            (1, "log.record", "one"),
            (2, "log.record", "two"),
        ]
        log.publish(message(text="three"))
        (live,) = await take(stream, 1)
        assert (live.sequence, live.log_record.message) == (3, "three")
        assert live.time.seconds > 0
        await nothing_more(stream)
    assert log.subscriber_count == 0


async def test_filters(events_client: ACPClient, log: EventLog) -> None:
    log.publish_many(
        [
            tool("p1"),
            message(session_id="s1"),
            tool("p2", namespace="team"),
            message(session_id="s2", namespace="team"),
            tool("p1"),
        ]
    )
    cases: list[tuple[dict[str, object], list[int]]] = [
        ({"plan_id": "p1"}, [1, 5]),
        ({"session_id": "s2"}, [4]),
        ({"event_type": ["tool.invoked"]}, [1, 3, 5]),
        ({"event_type": ["tool.invoked", "log.record"], "namespace": "team"}, [3, 4]),
        ({"after_sequence": 3}, [4, 5]),
        ({"plan_id": "p1", "after_sequence": 1}, [5]),
    ]
    for fields, expected in cases:
        async with opened(events_client, fields) as stream:
            assert [e.sequence for e in await take(stream, len(expected))] == expected, fields
            await nothing_more(stream)


async def test_bad_filters_are_invalid_params(events_client: ACPClient) -> None:
    error = await refused(events_client, event_type=["tool.invoked", "nope"])
    assert error.code == "INVALID_PARAMS"
    assert error.details["unknown"] == ["nope"]
    assert error.details["valid"] == sorted(EVENT_TYPES)
    error = await refused(events_client, after_sequence=-5)
    assert (error.code, error.details["field"]) == ("INVALID_PARAMS", "after_sequence")
    error = await refused(events_client, after_sequence="soon")
    assert error.code == "INVALID_PARAMS"


async def test_errors_surface_before_the_first_item(log: EventLog) -> None:
    """Validation and authorization happen when the stream is opened, so a transport can
    answer with a real error status before any stream headers."""
    facade = ServiceFacade(events_table(log), authenticator=OnlyNamespaceA())
    op = catalog.OPERATIONS["events.subscribe"]
    with pytest.raises(ACPError) as info:
        await facade.stream(op, events_pb2.SubscribeEventsRequest(event_type=["x"]), CallContext(token="t-a"))
    assert info.value.code == "INVALID_PARAMS"
    with pytest.raises(ACPError) as info:
        await facade.stream(op, events_pb2.SubscribeEventsRequest(namespace="b"), CallContext(token="t-a"))
    assert info.value.code == "AUTH_FORBIDDEN"
    with pytest.raises(ACPError) as info:
        await facade.stream(op, events_pb2.SubscribeEventsRequest(), CallContext(token="wrong"))
    assert info.value.code == "AUTH_REQUIRED"
    assert log.subscriber_count == 0


async def test_principal_sees_only_its_namespaces(log: EventLog) -> None:
    facade = ServiceFacade(events_table(log), authenticator=OnlyNamespaceA())
    async with ACPClient(LocalTransport(facade, owns_facade=True), token="t-a") as client:
        log.publish_many([message(namespace="a", text="mine"), message(namespace="b", text="theirs")])
        async with opened(client) as stream:
            log.publish(message(namespace="b", text="theirs too"))
            log.publish(message(namespace="a", text="mine too"))
            got = await take(stream, 2)
            assert [e.log_record.message for e in got] == ["mine", "mine too"]
            await nothing_more(stream)
        assert (await refused(client, namespace="b")).code == "AUTH_FORBIDDEN"


async def test_slow_subscriber_is_told_where_to_resume(events_client: ACPClient, log: EventLog) -> None:
    got: list[events_pb2.Event] = []

    async def read_until_ended(stream: AsyncIterator[events_pb2.Event]) -> None:
        while True:
            got.append(await asyncio.wait_for(anext(stream), TIMEOUT))

    async with opened(events_client) as stream:
        log.publish(message(text="0"))
        got += await take(stream, 1)
        # The reader stops while 100 events arrive; its queue holds 32.
        for i in range(1, 101):
            log.publish(message(text=str(i)))
        with pytest.raises(ACPError) as info:
            await read_until_ended(stream)
    assert info.value.code == "BUDGET_EXCEEDED"
    assert info.value.details["refinement"] == "SUBSCRIBER_TOO_SLOW"
    last = info.value.details["last_sequence"]
    assert last == got[-1].sequence == 33
    async with opened(events_client, after_sequence=last) as stream:
        got += await take(stream, 101 - last)
    assert [e.log_record.message for e in got] == [str(i) for i in range(101)]


async def test_a_client_of_the_prior_minor_can_subscribe(log: EventLog) -> None:
    log.publish(message())
    facade = ServiceFacade(events_table(log))
    prior = versions.SUPPORTED[-1]
    async with ACPClient(LocalTransport(facade, owns_facade=True), acp_version=prior) as client:
        assert (await first_event(client)).sequence == 1


async def test_open_facade_serves_the_log_and_closes_it(db_path: pathlib.Path) -> None:
    """Events already in the file are the backlog; closing the facade ends live streams."""
    store = SQLiteStore(db_path)
    earlier = EventLog(store)
    earlier.publish_many([tool("p1"), tool("p2")])
    earlier.close()
    store.close()

    facade = open_facade(db_path)
    client = ACPClient(LocalTransport(facade))
    stream = client.subscribe(plan_id="p2")
    assert [e.sequence for e in await take(stream, 1)] == [2]

    async def next_event() -> events_pb2.Event:
        return await anext(stream)

    waiting = asyncio.create_task(next_event())
    await asyncio.sleep(0.01)
    assert not waiting.done()
    await facade.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, TIMEOUT)


async def test_open_facade_takes_retention_from_the_environment(
    db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SQLiteStore(db_path)
    earlier = EventLog(store)
    earlier.publish_many([tool("p1") for _ in range(20)])
    earlier.close()
    store.close()
    monkeypatch.setenv("ACP_EVENT_RETENTION_COUNT", "5")
    facade = open_facade(db_path)
    async with ACPClient(LocalTransport(facade, owns_facade=True)) as client:
        assert (await first_event(client)).sequence == 16

    monkeypatch.setenv("ACP_EVENT_RETENTION_SECONDS", "soon")
    with pytest.raises(ValueError, match="ACP_EVENT_RETENTION_SECONDS"):
        open_facade(db_path)


async def test_subscribers_of_one_event_share_its_response(log: EventLog) -> None:
    """With several subscribers attached, each event is wrapped once for all of them; a
    lone subscriber gets responses of its own. Either way every response is exact."""
    facade = ServiceFacade(events_table(log))
    op = catalog.OPERATIONS["events.subscribe"]
    log.publish_many([message(text=f"m{i}") for i in range(5)])

    async def read(items: AsyncIterator[Any], count: int) -> list[Any]:
        got = []
        async with asyncio.timeout(TIMEOUT):
            async for item in items:
                got.append(item)
                if len(got) == count:
                    break
        await cast(AsyncGenerator[Any, None], items).aclose()
        return got

    request = events_pb2.SubscribeEventsRequest()
    first = await facade.stream(op, request, CallContext())
    second = await facade.stream(op, request, CallContext())
    # Read side by side: a stream closed detaches its subscription at once.
    one, two = await asyncio.gather(read(first, 5), read(second, 5))
    assert all(a is b for a, b in zip(one, two, strict=True))
    assert [r.event.log_record.message for r in one] == [f"m{i}" for i in range(5)]

    async def detached() -> bool:  # closed generators detach on the loop's next turns
        return log.subscriber_count == 0

    await eventually(detached, seconds=TIMEOUT)
    alone = await read(await facade.stream(op, request, CallContext()), 5)
    assert alone == one
    assert all(a is not b for a, b in zip(alone, one, strict=True))
