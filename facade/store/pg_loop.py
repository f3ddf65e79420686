"""Reads the event loop drives itself: libpq in nonblocking pipeline mode, no thread.

A read on the store's reader threads pays a hand-off to a thread and one back, and the
GIL passed between them, at every wait for the server: about 35 µs of CPU on a loaded
machine, on top of the read itself. The store's plain reads (a record, a record with its
items, a page of a list) need no thread: the loop sends their statements on a connection
in nonblocking pipeline mode (libpq never waits then), watches its socket, and answers the
caller when the results are in. Reads from several callers queue on one connection, each
behind the one before (a pipeline), so the server takes them without a round trip apiece.

Each read is one pipeline segment, its statements and a Sync: one implicit transaction
(the connection's default isolation is ``REPEATABLE READ READ ONLY``), so every statement
of a read sees one snapshot, it costs no BEGIN or COMMIT, and a failing statement leaves
nothing open (the server rolls the segment back at its Sync and the next one is untouched).

- A caller that stops waiting (cancelled) leaves its segment queued: its results are read
  and dropped, so the connection's pipeline stays in step.
- A connection that fails (the server went, a broken socket) fails the reads waiting on it
  and is dropped; the next read opens another.
- Closing finishes the reads under way (``aclose``) or fails them (``close``).

Connections belong to one event loop (their sockets are watched by it).

``LoopWrites`` does the same for a write that is one statement and reads nothing first (a
record insert): no writer thread, and no BEGIN or COMMIT of its own. Writes that queue while
every connection has one in flight go together as the next segment, one implicit transaction
and one commit (group commit: on a disk where a flush costs milliseconds, a commit apiece
would bound the rate at a few hundred per connection). A segment whose statement failed
committed nothing (the server rolled it back at its Sync), so each of its writes is tried
again alone and only the failing one fails; a segment lost with its connection may or may
not have committed, and its writes fail as a write on a broken connection does.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

import psycopg
from psycopg import errors, pq

from cleveragents.acp.facade.store.pg_wire import DECODERS, PSYCOPG, Fallback, encode, rows

log = logging.getLogger(__name__)

_OK = (pq.ExecStatus.TUPLES_OK, pq.ExecStatus.COMMAND_OK)
# Every connection plans each statement for its own parameters and the tables as they are
# now: a prepared statement's generic plan, fixed once it has run five times, is kept until
# the table is next analyzed, so a lookup first prepared on a nearly empty table went on
# scanning it whole after thousands of inserts (session.show on PostgreSQL at a third of its
# rate after a burst of session.create; bench family postgres, p99 9 -> 100 ms).
CUSTOM_PLANS = "SET plan_cache_mode = force_custom_plan"
# What each read connection runs its implicit transactions as: one snapshot per read.
READ_SETUP = (
    "SET default_transaction_isolation = 'repeatable read'",
    "SET default_transaction_read_only = on",
    CUSTOM_PLANS,
)
# Writes queued behind one segment go in the next at most this many together.
MAX_BATCH = 64

Rows = list[tuple[Any, ...]]


class Statements:
    """Statement names and column decoders by statement text, shared by the connections
    (each prepares a statement the first time it sends it)."""

    def __init__(self) -> None:
        self._names: dict[str, tuple[bytes, bytes]] = {}
        # Per statement: its column decoders once seen, or None when a column's type is not
        # one this path decodes (the statement then goes through the store's threads).
        self.decoders: dict[str, list[Callable[[bytes], Any]] | None] = {}

    def name(self, statement: str) -> tuple[bytes, bytes]:
        """The statement's prepared name and its text with ``$n`` parameters."""
        known = self._names.get(statement)
        if known is None:
            numbered, count = statement, 0
            while "%s" in numbered:
                count += 1
                numbered = numbered.replace("%s", f"${count}", 1)
            known = self._names[statement] = (f"acp_loop_{len(self._names)}".encode(), numbered.encode())
        return known


# One statement ready to send: its text, prepared name, $n text, parameter values, formats.
_Send = tuple[str, bytes, bytes, list[bytes | None], list[int]]


class _Segment:
    """One read on a connection: what answers it, in the order the server sends them."""

    __slots__ = ("error", "expected", "future", "results")

    def __init__(self, future: asyncio.Future[list[pq.abc.PGresult]], expected: list[bytes | None]) -> None:
        self.future = future
        # Per message sent: the name of a statement being prepared, or None for a query.
        self.expected = collections.deque(expected)
        self.results: list[pq.abc.PGresult] = []
        self.error: Exception | None = None


class _Pipeline:
    """One connection in nonblocking pipeline mode, driven by its loop's reader callbacks."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: psycopg.AsyncConnection[Any],
        gone: Callable[[_Pipeline], None],
    ) -> None:
        self._loop = loop
        self._conn = conn
        self._pgconn = conn.pgconn
        self._gone = gone
        self._pgconn.nonblocking = 1
        self._pgconn.enter_pipeline_mode()
        self._fd = self._pgconn.socket
        self._waiting: collections.deque[_Segment] = collections.deque()
        self._prepared: set[bytes] = set()
        self._writing = False
        self.closed = False
        loop.add_reader(self._fd, self._readable)

    @property
    def depth(self) -> int:
        return len(self._waiting)

    def send(self, sends: Sequence[_Send]) -> asyncio.Future[list[pq.abc.PGresult]]:
        """Queue one read's statements and its Sync; its future has their results."""
        future: asyncio.Future[list[pq.abc.PGresult]] = self._loop.create_future()
        pgconn = self._pgconn
        expected: list[bytes | None] = []
        try:
            for _, name, numbered, values, formats in sends:
                if name not in self._prepared:
                    pgconn.send_prepare(name, numbered)
                    self._prepared.add(name)
                    expected.append(name)
                # libpq takes None for a NULL parameter (psycopg's stub says otherwise).
                pgconn.send_query_prepared(name, cast(Any, values), formats, result_format=1)
                expected.append(None)
            pgconn.pipeline_sync()
            self._waiting.append(_Segment(future, expected))
            self._flush()
        except psycopg.Error as exc:
            # Part of a segment may be queued without its Sync: the connection is unusable.
            self.fail(exc)
            if not future.done():
                future.set_exception(exc)
        return future

    def _flush(self) -> None:
        if self._pgconn.flush():
            if not self._writing:
                self._writing = True
                self._loop.add_writer(self._fd, self._writable)
        elif self._writing:
            self._writing = False
            self._loop.remove_writer(self._fd)

    def _writable(self) -> None:
        try:
            self._flush()
        except psycopg.Error as exc:
            self.fail(exc)

    def _readable(self) -> None:
        pgconn = self._pgconn
        try:
            pgconn.consume_input()
            if self._writing:
                self._flush()
            idle = False
            while self._waiting and not pgconn.is_busy():
                result = pgconn.get_result()
                if result is None:
                    # One None ends a statement's results; a second: nothing more is in.
                    if idle:
                        break
                    idle = True
                    continue
                idle = False
                self._take(result)
        except psycopg.Error as exc:
            self.fail(exc)
            return
        if pgconn.status == pq.ConnStatus.BAD:
            self.fail(psycopg.OperationalError(pgconn.get_error_message() or "the connection was lost"))

    def _take(self, result: pq.abc.PGresult) -> None:
        segment = self._waiting[0]
        status = result.status
        if status == pq.ExecStatus.PIPELINE_SYNC:
            self._waiting.popleft()
            future = segment.future
            if future.done():  # the caller stopped waiting
                return
            if segment.error is not None:
                future.set_exception(segment.error)
            else:
                future.set_result(segment.results)
            return
        preparing = segment.expected.popleft() if segment.expected else None
        if status in _OK:
            if preparing is None:
                segment.results.append(result)
            return
        if preparing is not None:
            # Not prepared after all: a later read prepares it again.
            self._prepared.discard(preparing)
        if status != pq.ExecStatus.PIPELINE_ABORTED and segment.error is None:
            segment.error = errors.error_from_result(result, encoding=self._conn.info.encoding)

    def fail(self, exc: Exception) -> None:
        """Fail every read waiting here and drop the connection."""
        if self.closed:
            return
        self.close()
        self._gone(self)
        for segment in self._waiting:
            if not segment.future.done():
                # The read the failure came in on has its own error (the server's, say).
                segment.future.set_exception(segment.error or type(exc)(str(exc)))
        self._waiting.clear()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
            if self._writing:
                self._loop.remove_writer(self._fd)
        self._pgconn.finish()

    async def drain(self) -> None:
        """Wait for the reads queued here to be answered."""
        for segment in list(self._waiting):
            with contextlib.suppress(BaseException):
                await asyncio.shield(segment.future)


class LoopReads:
    """One event loop's reads: a few pipelined connections, opened when first needed."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        url: str,
        connect_timeout: int,
        size: int,
        setup: Sequence[str] = READ_SETUP,
    ) -> None:
        self.loop = loop
        self._url = url
        self._connect_timeout = connect_timeout
        self._size = size
        self._setup = setup
        self._pipelines: list[_Pipeline] = []
        self._opening: asyncio.Task[_Pipeline] | None = None
        self._statements = Statements()
        self.closed = False

    async def run(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[Rows] | Fallback:
        """Each statement's rows, in one snapshot; ``PSYCOPG``, with nothing run, when a
        parameter or a result column is not one this path takes (or no connection opens:
        the store's threads then wait for one as they would)."""
        sends = self._sends(statements)
        if sends is PSYCOPG:
            return PSYCOPG
        decoders = self._statements.decoders
        pipeline = await self._pipeline()
        if pipeline is None:
            return PSYCOPG
        results = await pipeline.send(sends)
        answers: list[Rows] = []
        for send, result in zip(sends, results, strict=True):
            columns = decoders.get(send[0])
            if columns is None:
                types = [result.ftype(column) for column in range(result.nfields)]
                if not all(oid in DECODERS for oid in types):
                    decoders[send[0]] = None
                    return PSYCOPG
                columns = decoders[send[0]] = [DECODERS[oid] for oid in types]
            answers.append(rows(result, columns))
        return answers

    def _sends(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> list[_Send] | Fallback:
        sends: list[_Send] = []
        decoders = self._statements.decoders
        for statement, params in statements:
            if decoders.get(statement, ()) is None:
                return PSYCOPG
            encoded = encode(params)
            if encoded is None:
                return PSYCOPG
            name, numbered = self._statements.name(statement)
            sends.append((statement, name, numbered, *encoded))
        return sends

    async def _pipeline(self) -> _Pipeline | None:
        """The least busy connection, or a new one while there are fewer than ``size``
        and each has reads waiting."""
        if self.closed:
            raise RuntimeError("the store is closed")
        pipelines = self._pipelines
        best = min(pipelines, key=lambda p: p.depth) if pipelines else None
        if best is not None and (best.depth == 0 or len(pipelines) >= self._size):
            return best
        if self._opening is None:
            self._opening = self.loop.create_task(self._open())
            # Seen by whoever awaits it, or else only logged (by _pipeline, if awaited).
            self._opening.add_done_callback(_seen)
        opening = self._opening
        if best is not None and not opening.done():
            return best
        try:
            return await asyncio.shield(opening)
        except (psycopg.Error, OSError) as exc:
            log.warning("a loop connection for reads did not open (%s); reads go through threads", exc)
            return None

    async def _open(self) -> _Pipeline:
        conn: psycopg.AsyncConnection[Any] | None = None
        try:
            conn = await psycopg.AsyncConnection.connect(
                self._url, autocommit=True, connect_timeout=self._connect_timeout
            )
            for setting in self._setup:
                await conn.execute(setting)
            if self.closed:
                raise RuntimeError("the store is closed")
            pipeline = _Pipeline(self.loop, conn, self._gone)
            self._pipelines.append(pipeline)
            return pipeline
        except BaseException:
            # Cancelled, or its loop closed while it was opening (a write lane opens a second
            # connection nobody waits for): closed here, not left to the garbage collector.
            if conn is not None and not conn.closed:
                conn.pgconn.finish()
            raise
        finally:
            self._opening = None

    def _gone(self, pipeline: _Pipeline) -> None:
        with contextlib.suppress(ValueError):
            self._pipelines.remove(pipeline)

    async def drain(self) -> None:
        """Wait for every read under way here to be answered."""
        for pipeline in list(self._pipelines):
            await pipeline.drain()

    def close(self, why: Exception) -> None:
        """Fail the reads still waiting (with ``why``) and close the connections; on the
        loop's thread, or anywhere once the loop is closed."""
        self.closed = True
        opening = self._opening
        if opening is not None and not self.loop.is_closed():
            opening.cancel()
        for pipeline in list(self._pipelines):
            pipeline.fail(why)
        self._pipelines.clear()


class _Write:
    """One write waiting for its segment; ``alone``: it goes in a segment of its own (a
    segment it shared failed)."""

    __slots__ = ("alone", "future", "send")

    def __init__(self, send: _Send, future: asyncio.Future[int | Fallback]) -> None:
        self.send = send
        self.future = future
        self.alone = False


class LoopWrites(LoopReads):
    """One event loop's one-statement writes (the module's docstring): each connection has at
    most one segment in flight; what queues meanwhile goes together in the next."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        url: str,
        connect_timeout: int,
        size: int,
        setup: Sequence[str],
    ) -> None:
        super().__init__(loop, url, connect_timeout, size, setup)
        self._queue: collections.deque[_Write] = collections.deque()
        self._retry_open_at = 0.0

    async def write(self, statement: str, params: Sequence[Any]) -> int | Fallback:
        """The number of rows the statement wrote, once its commit is durable; ``PSYCOPG``,
        with nothing run, when a parameter is not one this path takes or no connection opens
        (the store's writer threads then take the write)."""
        if self.closed:
            raise RuntimeError("the store is closed")
        sends = self._sends([(statement, params)])
        if sends is PSYCOPG:
            return PSYCOPG
        write = _Write(sends[0], self.loop.create_future())
        self._queue.append(write)
        self._dispatch()
        # A caller that stops waiting cancels its future: unsent, it is never sent.
        return await write.future

    def _dispatch(self) -> None:
        """Send what is queued on the connections with nothing in flight; open one more
        while there are fewer than ``size`` (not again within a second of one failing)."""
        if self.closed:
            self._fail_queued(RuntimeError("the store is closed"))
            return
        for pipeline in self._pipelines:
            if pipeline.depth or pipeline.closed:
                continue
            batch = self._take()
            if not batch:
                return
            sent = pipeline.send([write.send for write in batch])
            sent.add_done_callback(functools.partial(self._answered, batch))
        if (
            self._queue
            and len(self._pipelines) < self._size
            and self._opening is None
            and self.loop.time() >= self._retry_open_at
        ):
            self._opening = self.loop.create_task(self._open())
            self._opening.add_done_callback(self._opened)

    def _take(self) -> list[_Write]:
        """The next segment's writes: those queued, up to ``MAX_BATCH``, or one alone."""
        queue = self._queue
        batch: list[_Write] = []
        while queue and len(batch) < MAX_BATCH:
            write = queue[0]
            if write.future.done():  # its caller stopped waiting before it was sent
                queue.popleft()
                continue
            if write.alone and batch:
                break
            batch.append(queue.popleft())
            if write.alone:
                break
        return batch

    def _opened(self, task: asyncio.Task[_Pipeline]) -> None:
        if task.cancelled() or task.exception() is not None:
            self._retry_open_at = self.loop.time() + 1.0
            if not self._pipelines:
                why = "cancelled" if task.cancelled() else task.exception()
                log.warning("a loop connection for writes did not open (%s); writes go through threads", why)
                for write in self._queue:
                    if not write.future.done():
                        write.future.set_result(PSYCOPG)
                self._queue.clear()
                return
        self._dispatch()

    def _answered(self, batch: list[_Write], sent: asyncio.Future[list[pq.abc.PGresult]]) -> None:
        error = RuntimeError("the store is closed") if sent.cancelled() else sent.exception()
        if error is None:
            for write, result in zip(batch, sent.result(), strict=True):
                if not write.future.done():
                    write.future.set_result(result.command_tuples or 0)
        elif len(batch) > 1 and _rolled_back(error):
            for write in reversed(batch):
                write.alone = True
                self._queue.appendleft(write)
        else:
            for write in batch:
                if not write.future.done():
                    write.future.set_exception(error)
        self._dispatch()

    def _fail_queued(self, why: Exception) -> None:
        for write in self._queue:
            if not write.future.done():
                write.future.set_exception(type(why)(str(why)))
        self._queue.clear()

    async def drain(self) -> None:
        """Wait for every write queued or under way here to be answered, and for a
        connection being opened."""
        opening = self._opening
        if opening is not None:
            with contextlib.suppress(BaseException):
                await asyncio.shield(opening)
        while self._queue or any(pipeline.depth for pipeline in self._pipelines):
            for write in list(self._queue):
                with contextlib.suppress(BaseException):
                    await asyncio.shield(write.future)
            await super().drain()

    def close(self, why: Exception) -> None:
        super().close(why)
        self._fail_queued(why)


def _rolled_back(error: BaseException) -> bool:
    """Whether a failed segment certainly committed nothing, so its writes may go again: a
    statement's error from the server (it rolls the segment back), but not a lock waited for
    to the bound (each would wait again) nor a connection lost (the commit may have been done)."""
    return getattr(error, "sqlstate", None) is not None and not isinstance(
        error, (errors.LockNotAvailable, errors.QueryCanceled, errors.DeadlockDetected)
    )


def _seen(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("a loop connection for reads did not open: %s", task.exception())
