"""What every store does after a commit: run the ``after_commit`` callbacks and answer the
``write`` calls on their callers' loops, in commit order.

A store thread commits, then (still in commit order, under the lock that ordered the
commits) hands the calls to ``CommitOrder.due``; ``announce`` asks each caller's loop to
``drain``, which runs the callbacks and resolves the futures in the order they came due,
so the event log fans out in sequence order whichever loop drains first.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from cleveragents.acp.facade.store.requests import CLAIM

log = logging.getLogger(__name__)


def current_task() -> asyncio.Task[Any] | None:
    """The task running on this thread's loop; None on a thread without one (a store
    thread), found without raising: the writer asks at every statement of every write."""
    # The lookup get_running_loop makes, without its raise: a store thread has no loop, so
    # the public call would raise (and be caught) at every statement there.
    loop = asyncio._get_running_loop()  # noqa: SLF001 - deliberate fast path under asyncio
    return None if loop is None else asyncio.current_task(loop)


def running_loop() -> asyncio.AbstractEventLoop | None:
    """This thread's running loop, or None, without raising (``current_task``'s fast path)."""
    return asyncio._get_running_loop()  # noqa: SLF001 - deliberate fast path under asyncio


def run_callback(callback: Callable[[], None]) -> None:
    """The write is committed and acknowledged; a failing callback must not undo that."""
    try:
        callback()
    except Exception:
        log.exception("after-commit callback %r failed", callback)


class Job:
    """One ``write`` call on its way through a store thread."""

    __slots__ = (
        "callbacks",
        "context",
        "deadline",
        "error",
        "fn",
        "future",
        "loop",
        "queued",
        "result",
        "settled",
    )

    def __init__(
        self, fn: Callable[[Any], Any], loop: asyncio.AbstractEventLoop | None, deadline: float
    ) -> None:
        self.fn = fn
        # The caller's context travels with fn (the trace id an event it appends carries).
        self.context = contextvars.copy_context()
        self.loop = loop
        self.future: asyncio.Future[Any] | None = loop.create_future() if loop is not None else None
        # Set once the write committed or failed, even if its caller stopped waiting: a
        # write under a request id's claim has one (``Claim.pending``).
        self.settled: asyncio.Event | None = None
        claim = CLAIM.get()
        if claim is not None and claim.open and loop is not None:
            self.settled = asyncio.Event()
            claim.pending.append(self.settled)
        self.deadline = deadline
        # When the call was made: what it waited before its transaction began is measured from here.
        self.queued = time.monotonic()
        self.result: Any = None
        self.error: BaseException | None = None
        self.callbacks: list[Callable[[], None]] = []

    def run(self, store: Any) -> Any:
        """``fn(store)`` in the caller's context, on the store thread."""
        return self.context.run(self.fn, store)


def done(callbacks: list[Callable[[], None]]) -> Job:
    """A committed transaction nobody awaits (a blocking caller's): only its callbacks."""
    job = Job(lambda _store: None, None, 0.0)
    job.callbacks = callbacks
    return job


class CommitOrder:
    """Committed (or failed) calls whose callbacks and answers are due, in commit order."""

    def __init__(self) -> None:
        self._due: collections.deque[Job] = collections.deque()
        self._due_lock = threading.Lock()
        self._drain_lock = threading.RLock()
        # Loops asked to drain that have not started yet (under ``_due_lock``): a job due
        # meanwhile is drained by that call, so it costs no second wake-up of the loop
        # (each is a write to its self-pipe and a drain pass there).
        self._asked: set[asyncio.AbstractEventLoop] = set()

    def due(self, jobs: Iterable[Job]) -> None:
        """Queue jobs; the caller holds whatever orders its commits."""
        with self._due_lock:
            self._due.extend(jobs)

    def settle(self, jobs: list[Job]) -> None:
        """Failed before any commit: due now (no callbacks to keep in order), and announced."""
        self.due(jobs)
        self.announce(jobs)

    def announce(self, jobs: Iterable[Job]) -> None:
        """Ask each job's loop to drain, unless it was asked and has not started yet (the
        jobs came due before this, so that drain finds them)."""
        for loop in {id(job.loop): job.loop for job in jobs if job.loop is not None}.values():
            with self._due_lock:
                if loop in self._asked:
                    continue
                self._asked.add(loop)
            try:
                loop.call_soon_threadsafe(self._drain_asked, loop)
            except RuntimeError:  # a closed loop: nobody waits for the answer
                with self._due_lock:
                    self._asked.discard(loop)

    def _drain_asked(self, loop: asyncio.AbstractEventLoop) -> None:
        # Forgotten before draining: a job due from here on asks again.
        with self._due_lock:
            self._asked.discard(loop)
        self.drain()

    def drain(self) -> None:
        """Run due callbacks and answer due calls, in commit order (on a caller's thread)."""
        with self._drain_lock:
            while True:
                with self._due_lock:
                    if not self._due:
                        return
                    job = self._due.popleft()
                if job.loop is not None and job.loop is not running_loop():
                    job.loop.call_soon_threadsafe(self._finish, job)
                else:
                    self._finish(job)

    @staticmethod
    def _finish(job: Job) -> None:
        for callback in job.callbacks:
            run_callback(callback)
        if job.settled is not None:
            job.settled.set()
        future = job.future
        if future is None or future.done():
            return
        if job.error is not None:
            future.set_exception(job.error)
        else:
            future.set_result(job.result)
