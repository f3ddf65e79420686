"""What each layer written by hand under a library buys over that library's supported path,
both measured in this run, in process, interleaved (docs/architecture.md, "Layers written
under the libraries"). Each figure is the supported path's time per operation / the layer's
(above 1: the layer is faster by that much).

- ``layer_codec_print_ratio`` / ``layer_codec_parse_ratio``: ``json_format`` (``MessageToDict``
  with the codec's options; ``ParseDict``) / ``contract/codec_fast.py``, on a
  ``session.show`` answer with a 20-message history and on a ``session.tell`` request.
- ``layer_read_cache_ratio``: ``SQLiteStore.read_get`` of one record from the event loop with
  the read cache off (a reader thread's statement) / on (answered from memory after a look
  at the WAL-index mapping, ``facade/store/wal_index.py``). ``layer_wal_index_look_ratio``:
  the supported way to ask "did anyone commit?" (``PRAGMA data_version`` on a connection of
  its own) / a look at the mapping; the details hold both in µs, so the cache's figure with
  ``data_version`` in its place is ``cached + data_version - mapping``.
- ``layer_http_protocol_ratio``: req/s of ``session.show`` over the envelope at 16
  connections, the gateway served with its own HTTP/1.1 protocol (``gateway/http/protocol.py``:
  uvicorn's httptools protocol with the guards below the application, each answer of known
  length in one send) / served by uvicorn's httptools protocol alone; both on uvloop,
  ``bench/gateway_http.py``, the same app and store, the median of alternated rounds' ratios
  (``bench.unary.alternated``). ``layer_http_protocol_cpu_ratio``: server CPU per request,
  the other way round (httptools' / ours). Unlike the other layers, this one is kept for its
  guards, not its speed: the goal is that they cost little (≥ 0.95, ≥ 0.9). Each side's
  median req/s, p99 and CPU µs per request in the details.
- ``layer_pg_wire_ratio`` (only with PostgreSQL): a one-statement read transaction
  (``BEGIN … READ ONLY``, the point ``SELECT``, ``COMMIT``) through psycopg's own pipeline
  mode with its prepared statements / through ``facade/store/pg_wire.py`` (libpq's prepared
  statement, the COMMIT read with the next read), wall time per read on one connection;
  psycopg's plain prepared ``execute`` (autocommit, no transaction) in the details.
- ``layer_pg_loop_ratio`` (only with PostgreSQL): 16 concurrent tasks reading one record
  each time, through psycopg's ``AsyncConnectionPool`` (2 connections, prepared statements)
  / through ``facade/store/pg_loop.py``'s ``LoopReads`` (2 pipelined connections), wall time
  per read; process CPU per read of each in the details.

Batches of the two alternate (ABBA); the figure is the median of the pairs' ratios.
"""

from __future__ import annotations

import asyncio
import pathlib
import sqlite3
import statistics
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import orjson
import psycopg
from google.protobuf import json_format
from psycopg_pool import AsyncConnectionPool

from bench import baselines, postgres
from bench.procs import ServerProcess, python_module
from bench.run import Run
from bench.unary import _http, alternated
from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract import codec_fast
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.store.base import Record
from cleveragents.acp.facade.store.pg_loop import CUSTOM_PLANS, LoopReads
from cleveragents.acp.facade.store.pg_wire import PSYCOPG, Wire
from cleveragents.acp.facade.store.postgres import PostgresStore
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.facade.store.wal_index import WalIndex
from cleveragents.acp.v1 import common_pb2, session_pb2

# Operations per batch and batch pairs, per mode.
_BATCH = {"smoke": 20, "quick": 400, "full": 1000}
_PAIRS = {"smoke": 2, "quick": 8, "full": 12}
_COLUMNS = "kind, id, namespace, name, revision, state, attrs, labels, create_time, update_time, body"
_GET = f"SELECT {_COLUMNS} FROM records WHERE kind = %s AND id = %s"
_BEGIN_READ = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
_CONCURRENT = 16
KINDS = ("httptools", "ours")


def _pairs(
    count: int, pairs: int, supported: Callable[[], float], layer: Callable[[], float]
) -> tuple[float, float, float]:
    """(median ratio supported/layer, median µs per op supported, layer); each callable
    runs one batch of ``count`` operations and returns its seconds."""
    ratios, ours, theirs = [], [], []
    for i in range(pairs):
        order = (supported, layer) if i % 2 == 0 else (layer, supported)
        measured = {fn: fn() / count * 1e6 for fn in order}
        ratios.append(measured[supported] / measured[layer])
        theirs.append(measured[supported])
        ours.append(measured[layer])
    return statistics.median(ratios), statistics.median(theirs), statistics.median(ours)


def _timed(op: Callable[[], Any], count: int) -> Callable[[], float]:
    def batch() -> float:
        started = time.perf_counter()
        for _ in range(count):
            op()
        return time.perf_counter() - started

    return batch


def _report(run: Run, figure: str, measured: tuple[float, float, float], supported: str, layer: str) -> None:
    ratio, theirs, ours = measured
    run.record(figure, ratio, "in-process")
    run.note(f"{figure}.{supported}_us", theirs)
    run.note(f"{figure}.{layer}_us", ours)


def _shown() -> session_pb2.GetSessionResponse:
    shown = session_pb2.GetSessionResponse(
        session=session_pb2.Session(
            meta=common_pb2.EntityMeta(id="01J0000000000000000000000A", namespace="default"),
            orchestrator="orchestrator",
            state=session_pb2.SESSION_STATE_ACTIVE,
            labels={"team": "build"},
            message_count=20,
        )
    )
    shown.session.meta.create_time.GetCurrentTime()
    shown.session.meta.update_time.GetCurrentTime()
    for index in range(20):
        message = shown.messages.add(
            id=f"01J00000000000000000000{index:03d}",
            index=index,
            role=session_pb2.MESSAGE_ROLE_USER if index % 2 == 0 else session_pb2.MESSAGE_ROLE_ORCHESTRATOR,
            content=f"message {index} " * 8,
        )
        message.create_time.GetCurrentTime()
    return shown


def codec(run: Run) -> None:
    count, pairs = _BATCH[run.mode.name], _PAIRS[run.mode.name]
    shown = _shown()
    _report(
        run,
        "layer_codec_print_ratio",
        _pairs(
            count,
            pairs,
            _timed(
                lambda: json_format.MessageToDict(
                    shown, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
                ),
                count,
            ),
            _timed(lambda: codec_fast.to_dict(shown), count),
        ),
        "json_format",
        "codec_fast",
    )
    told = {"session_id": "01J0000000000000000000000A", "content": "what is the state of the build?"}

    def parse_fast() -> None:
        codec_fast.from_dict(told, session_pb2.TellSessionRequest())

    _report(
        run,
        "layer_codec_parse_ratio",
        _pairs(
            count,
            pairs,
            _timed(lambda: json_format.ParseDict(told, session_pb2.TellSessionRequest()), count),
            _timed(parse_fast, count),
        ),
        "json_format",
        "codec_fast",
    )


def _record() -> Record:
    now = time.time()
    return Record(
        kind="session",
        id="01J0000000000000000000000A",
        namespace="default",
        body=b"x" * 600,
        attrs={"orchestrator": "orchestrator"},
        create_time=now,
        update_time=now,
    )


async def _read_batches(
    count: int, pairs: int, cached: SQLiteStore, uncached: SQLiteStore, record: Record
) -> tuple[float, float, float]:
    async def batch(store: SQLiteStore) -> float:
        started = time.perf_counter()
        for _ in range(count):
            await store.read_get(record.kind, record.id)
        return time.perf_counter() - started

    for store in (cached, uncached):
        await batch(store)
    ratios, theirs, ours = [], [], []
    for i in range(pairs):
        order = (uncached, cached) if i % 2 == 0 else (cached, uncached)
        measured = {store: await batch(store) / count * 1e6 for store in order}
        ratios.append(measured[uncached] / measured[cached])
        theirs.append(measured[uncached])
        ours.append(measured[cached])
    return statistics.median(ratios), statistics.median(theirs), statistics.median(ours)


def read_cache(run: Run) -> None:
    count, pairs = _BATCH[run.mode.name], _PAIRS[run.mode.name]
    folder = run.scratch("layers")
    record = _record()
    cached = SQLiteStore(folder / "cached.db")
    uncached = SQLiteStore(folder / "uncached.db", cache_reads=False)
    try:
        for store in (cached, uncached):
            store.insert(record)
        measured = asyncio.run(_read_batches(count, pairs, cached, uncached, record))
        _report(run, "layer_read_cache_ratio", measured, "uncached", "cached")
        index = WalIndex(pathlib.Path(folder / "cached.db"))
        watch = sqlite3.connect(str(folder / "cached.db"), isolation_level=None, check_same_thread=False)
        try:
            watch.execute("PRAGMA busy_timeout=0")
            looks = count * 10
            _report(
                run,
                "layer_wal_index_look_ratio",
                _pairs(
                    looks,
                    pairs,
                    _timed(lambda: watch.execute("PRAGMA data_version").fetchone(), looks),
                    _timed(index.state, looks),
                ),
                "data_version",
                "mapping",
            )
        finally:
            watch.close()
            index.close()
    finally:
        cached.close()
        uncached.close()


def _pg_connection(url: str, *, wire: bool) -> psycopg.Connection[Any]:
    conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
    if wire:
        conn.prepare_threshold = None
    conn.execute(CUSTOM_PLANS)
    return conn


def pg_wire(run: Run, url: str, record: Record) -> None:
    count, pairs = _BATCH[run.mode.name], _PAIRS[run.mode.name]
    wire = Wire()
    ours = _pg_connection(url, wire=True)
    theirs = _pg_connection(url, wire=False)
    plain = _pg_connection(url, wire=False)
    params = (record.kind, record.id)
    begin = _BEGIN_READ.encode()

    def layer() -> None:
        row = wire.run(ours, _GET, params, "one", begin)
        wire.commit_later(ours)
        assert row is not None

    def supported() -> None:
        with theirs.pipeline():
            theirs.execute(_BEGIN_READ)
            cursor = theirs.execute(_GET, params, prepare=True, binary=True)
            theirs.execute("COMMIT")
        assert cursor.fetchone() is not None

    def autocommit() -> None:
        assert plain.execute(_GET, params, prepare=True, binary=True).fetchone() is not None

    try:
        for op in (layer, supported, autocommit):
            _timed(op, count)()
        _report(
            run,
            "layer_pg_wire_ratio",
            _pairs(count, pairs, _timed(supported, count), _timed(layer, count)),
            "psycopg_pipeline",
            "pg_wire",
        )
        ratio, single, _ = _pairs(count, pairs, _timed(autocommit, count), _timed(layer, count))
        run.note("layer_pg_wire_ratio.psycopg_autocommit_us", single)
        run.note("layer_pg_wire_ratio.psycopg_autocommit_ratio", ratio)
    finally:
        wire.settle(ours)
        for conn in (ours, theirs, plain):
            conn.close()


async def _pg_loop(run: Run, url: str, record: Record) -> None:
    count, pairs = _BATCH[run.mode.name], _PAIRS[run.mode.name]
    loop = asyncio.get_running_loop()
    reads = LoopReads(loop, url, 10, 2)
    pool: AsyncConnectionPool[psycopg.AsyncConnection[Any]] = AsyncConnectionPool(
        url, min_size=2, max_size=2, kwargs={"autocommit": True}, open=False
    )
    await pool.open()
    params = (record.kind, record.id)

    async def layer_read() -> None:
        answers = await reads.run([(_GET, params)])
        assert answers != PSYCOPG
        assert answers[0]

    async def supported_read() -> None:
        async with pool.connection() as conn:
            cursor = await conn.execute(_GET, params, prepare=True, binary=True)
            assert await cursor.fetchone() is not None

    def timed(read: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[tuple[float, float]]]:
        async def batch() -> tuple[float, float]:
            async def task() -> None:
                for _ in range(count // _CONCURRENT):
                    await read()

            started, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(task() for _ in range(_CONCURRENT)))
            return time.perf_counter() - started, time.process_time() - cpu

        return batch

    done = count // _CONCURRENT * _CONCURRENT
    try:
        for read in (layer_read, supported_read):
            await timed(read)()
        ratios, theirs, ours, theirs_cpu, ours_cpu = [], [], [], [], []
        for i in range(pairs):
            order = ("supported", "layer") if i % 2 == 0 else ("layer", "supported")
            measured = {
                name: await timed(supported_read if name == "supported" else layer_read)() for name in order
            }
            ratios.append(measured["supported"][0] / measured["layer"][0])
            theirs.append(measured["supported"][0] / done * 1e6)
            ours.append(measured["layer"][0] / done * 1e6)
            theirs_cpu.append(measured["supported"][1] / done * 1e6)
            ours_cpu.append(measured["layer"][1] / done * 1e6)
        _report(
            run,
            "layer_pg_loop_ratio",
            (statistics.median(ratios), statistics.median(theirs), statistics.median(ours)),
            "psycopg_pool",
            "pg_loop",
        )
        run.note("layer_pg_loop_ratio.psycopg_pool_cpu_us", statistics.median(theirs_cpu))
        run.note("layer_pg_loop_ratio.pg_loop_cpu_us", statistics.median(ours_cpu))
    finally:
        await reads.drain()
        reads.close(RuntimeError("bench done"))
        await pool.close()


def pg(run: Run) -> None:
    reason = postgres.reachable()
    if reason is not None:
        print(f"bench: layers: no PostgreSQL ({reason}); pg_wire and pg_loop not measured")
        return
    record = _record()
    with postgres.schema() as url:
        store = PostgresStore(url)
        try:
            store.insert(record)
        finally:
            store.close()
        pg_wire(run, url, record)
        asyncio.run(_pg_loop(run, url, record))


async def _seed(db: pathlib.Path) -> str:
    facade = open_facade(db)
    try:
        created = await ACPClient(LocalTransport(facade)).call("session.create", title="bench")
        assert isinstance(created, session_pb2.CreateSessionResponse)
        return created.session.meta.id
    finally:
        await facade.close()


def http(run: Run) -> None:
    folder = run.scratch("layers-http")
    db = folder / "acp.db"
    session_id = asyncio.run(_seed(db))
    body = orjson.dumps({"operation": "session.show", "params": {"session_id": session_id}})

    def start(kind: str) -> ServerProcess:
        return ServerProcess(
            python_module("bench.gateway_http", kind, str(db)),
            ready_prefix=baselines.READY,
            log=run.scratch("logs") / f"gateway-{kind}.log",
        )

    # Started together: each opens the store and imports the gateway, seconds apiece.
    with ThreadPoolExecutor(len(KINDS)) as starting:
        servers = dict(zip(KINDS, starting.map(start, KINDS), strict=True))
    try:
        for server in servers.values():
            url = f"http://127.0.0.1:{server.info['port']}/api/v1/acp"
            answer = httpx.post(url, content=body, headers={"Content-Type": "application/json"}, timeout=10)
            if answer.status_code != 200 or session_id not in answer.text:
                raise RuntimeError(f"the gateway answered {answer.status_code}: {answer.text[:500]}")
        rounds = alternated(
            run,
            {
                kind: (
                    server,
                    _http(run, f"http://127.0.0.1:{server.info['port']}/api/v1/acp", "POST", body, {}),
                )
                for kind, server in servers.items()
            },
        )
    finally:
        for server in servers.values():
            server.stop()
    ours, theirs = rounds["ours"], rounds["httptools"]
    generator = ours[0].result.generator
    pairs = list(zip(ours, theirs, strict=True))
    run.record(
        "layer_http_protocol_ratio",
        statistics.median(o.result.rps / t.result.rps for o, t in pairs),
        generator,
    )
    # Server CPU per request, steadier than req/s on a shared machine (docs/benchmarks.md).
    run.record(
        "layer_http_protocol_cpu_ratio",
        statistics.median(t.cpu_us / o.cpu_us for o, t in pairs),
        generator,
    )
    for kind, measured in rounds.items():
        note = f"layer_http_protocol_ratio.{kind}"
        run.note(f"{note}_rps", statistics.median(m.result.rps for m in measured))
        run.note(f"{note}_p99_ms", statistics.median(m.result.p99_ms for m in measured))
        run.note(f"{note}_cpu_us", statistics.median(m.cpu_us for m in measured))


def run_all(run: Run) -> None:
    codec(run)
    read_cache(run)
    http(run)
    pg(run)
