"""Reader threads for a store's ``read``: the event loop hands them work and never waits.

Every hand-off between threads is a wake-up and a context switch, and on a loaded machine
each switch also makes the code around it slower. ``loop.run_in_executor`` paid one wake-up
of a pool thread and one ``call_soon_threadsafe`` per read (``session.show`` over gRPC: 590
µs of server CPU per call against 390 µs with the read made inline). Here:

- The first thread serves the queue. Reads queued while it works are taken at its next look
  (up to ``BATCH``) without waking anything, and a batch is answered with one
  ``call_soon_threadsafe`` per event loop: the more callers wait, the fewer hand-offs each costs.
- The other threads are helpers, woken only when the first one has been on one batch for
  ``stall`` seconds while reads wait behind it (a slow read, or a reader thread the machine
  set aside): a helper takes the waiting reads. So a slow read holds up the others for about
  ``stall`` at most, and at an ordinary load no second thread wakes and contends for the GIL
  (two threads taking turns on one queue cost about 5 context switches per gRPC call more).
- Reads that can be answered together are: a call with a ``together`` attribute (a function
  from a list of such calls to their answers, each an ``Outcome``) is run with the others of
  its batch that have the same ``together``, in one call of it. Each sqlite3 statement lets go
  of the GIL at its start and end and twice per row, and under load each let-go is a futex
  sleep and wake of the reader thread: one statement for the point reads of a batch is one
  set of them instead of one per read.
- A read asked for while the first thread sleeps is held until its event loop has run what is
  ready (at most ``HOLD``): the loop is then about to wait and let go of the GIL. Woken
  earlier, the reader found the GIL taken by the loop and went to sleep on it a second time
  (gRPC ``session.show``: 2.7 -> 1.3 reader context switches per call). Reads asked for
  while it works are queued at once and taken at its next look.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

# The most reads one thread takes at once: a slow one delays at most this many others.
BATCH = 32
# How long the first thread may be on one batch while reads wait before a helper takes them.
STALL_SECONDS = 0.002
# How long a read waits at most for its busy loop to run out of ready callbacks.
HOLD = 0.0005

_Read = tuple[Callable[[], Any], "asyncio.Future[Any]", asyncio.AbstractEventLoop]
_Answer = tuple["asyncio.Future[Any]", BaseException | None, Any]
# What ``together`` gives for each call it was handed: an error, or None and the result.
Outcome = tuple[BaseException | None, Any]
# Put on the helpers' queue: one of them takes what waits in the first thread's queue.
_HELP = "help"


class ReadLane:
    def __init__(self, threads: int, name: str, *, stall: float = STALL_SECONDS) -> None:
        if threads < 1:
            raise ValueError("a read lane needs at least one thread")
        self._queue: queue.SimpleQueue[_Read | None] = queue.SimpleQueue()
        self._helpers: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._stall = stall
        self._threads = [threading.Thread(target=self._serve, name=f"{name}-0", daemon=True)]
        self._threads += [
            threading.Thread(target=self._help, name=f"{name}-{n}", daemon=True) for n in range(1, threads)
        ]
        # When the first thread began its current batch (monotonic); 0.0 while it waits.
        self._busy_since = 0.0
        # The loop a stall check is scheduled on, if any (one at a time).
        self._watching: asyncio.AbstractEventLoop | None = None
        # Reads held per loop until it runs out of ready callbacks (under the lock).
        self._held: dict[asyncio.AbstractEventLoop, list[_Read]] = {}
        self._lock = threading.Lock()
        self._started = False
        self._closed = False

    async def run(self, call: Callable[[], T], *, urgent: bool = False) -> T:
        """``call()`` on a reader thread; its result or exception, here. ``urgent``: queued at
        once, never held (a read whose delay lets something else fall behind)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the store is closed")
            if not self._started:
                self._started = True
                for thread in self._threads:
                    thread.start()
            if urgent or self._busy_since or not getattr(loop, "_ready", None):
                self._queue.put((call, future, loop))
            else:
                held = self._held.get(loop)
                if held is None:
                    held = self._held[loop] = []
                    loop.call_soon(self._release, loop, time.monotonic() + HOLD)
                held.append((call, future, loop))
        if self._busy_since and len(self._threads) > 1:
            self._watch(loop, self._stall)
        return await future

    def close(self) -> None:
        """Finish the reads queued so far, then stop the threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
            for held in self._held.values():
                for read in held:
                    self._queue.put(read)
            self._held.clear()
            self._queue.put(None)
            for _ in self._threads[1:]:
                self._helpers.put(None)
        if started:
            for thread in self._threads:
                if thread is not threading.current_thread():
                    thread.join()

    # on the event loop -----------------------------------------------------------------

    def _release(self, loop: asyncio.AbstractEventLoop, deadline: float) -> None:
        """Queue the reads held for ``loop`` once it has nothing else ready (or at ``deadline``).

        asyncio's loops keep their ready callbacks in ``_ready`` (a loop without one gets
        its reads queued at once)."""
        if getattr(loop, "_ready", None) and time.monotonic() < deadline:
            loop.call_soon(self._release, loop, deadline)
            return
        with self._lock:
            for read in self._held.pop(loop, ()):
                if not read[1].done():
                    self._queue.put(read)

    def _watch(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        """Look again in ``delay`` seconds whether reads wait behind a stalled first thread."""
        watching = self._watching
        if watching is not None and not watching.is_closed():
            return
        self._watching = loop
        loop.call_later(delay, self._check, loop)

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        self._watching = None
        since = self._busy_since
        if not since or self._queue.empty():
            return
        waited = time.monotonic() - since
        if waited >= self._stall:
            self._helpers.put(_HELP)
        else:
            self._watch(loop, self._stall - waited)

    # on the reader threads --------------------------------------------------------------

    def _serve(self) -> None:
        """The first thread: every read, unless a helper takes it first."""
        while True:
            first = self._queue.get()
            if first is None:
                return
            self._busy_since = time.monotonic()
            batch = self._take([first])
            settled = _run(batch)
            self._busy_since = 0.0
            _answer(settled)

    def _help(self) -> None:
        """A helper: asked for help, it takes what waits while the first thread stays stalled."""
        while True:
            if self._helpers.get() is None:
                return
            while True:
                batch = self._take([])
                if not batch:
                    break
                _answer(_run(batch))
                since = self._busy_since
                if not since or time.monotonic() - since < self._stall:
                    break

    def _take(self, batch: list[_Read]) -> list[_Read]:
        """``batch`` and the reads queued now, up to ``BATCH``."""
        while len(batch) < BATCH:
            try:
                read = self._queue.get_nowait()
            except queue.Empty:
                break
            if read is None:
                # The first thread's stop signal: leave it for its next get().
                self._queue.put(None)
                break
            batch.append(read)
        return batch


def _run(batch: list[_Read]) -> dict[asyncio.AbstractEventLoop, list[_Answer]]:
    answers: dict[asyncio.AbstractEventLoop, list[_Answer]] = {}
    groups: dict[Callable[[list[Any]], list[Outcome]], list[_Read]] = {}
    for read in batch:
        call, future, loop = read
        together = getattr(call, "together", None)
        if together is not None:
            groups.setdefault(together, []).append(read)
            continue
        try:
            answer: _Answer = (future, None, call())
        except BaseException as exc:  # handed to the caller
            answer = (future, exc, None)
        answers.setdefault(loop, []).append(answer)
    for together, reads in groups.items():
        try:
            outcomes = together([call for call, _, _ in reads])
        except BaseException as exc:  # every call of the group fails with it
            outcomes = [(exc, None)] * len(reads)
        for (_, future, loop), (error, result) in zip(reads, outcomes, strict=True):
            answers.setdefault(loop, []).append((future, error, result))
    return answers


def _answer(answers: dict[asyncio.AbstractEventLoop, list[_Answer]]) -> None:
    for loop, settled in answers.items():
        # A closed loop: nobody waits for these answers.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_settle, settled)


def _settle(answers: list[_Answer]) -> None:
    for future, error, result in answers:
        if future.done():  # the caller gave up (cancelled)
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
