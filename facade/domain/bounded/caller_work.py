"""A thread pool of its own for work whose cost the caller shapes (JSON Schemas and inputs,
regexes over artifacts, context globs), shared fairly between namespaces and stopped when
its caller stops waiting.

``asyncio.to_thread`` runs on the loop's default pool (``min(32, cores + 4)`` threads: 6 on
2 cores), which also reads files and opens stores for everyone: eight abandoned ``plan.use``
calls with a slow schema once filled it and left other tenants unanswered for minutes.
Here:

- at most ``per_namespace`` jobs of one namespace hold a thread at once (the others wait on
  the loop, where a cancelled caller simply leaves the queue), so a namespace can never fill
  the pool others need;
- a job learns that its caller left through ``checkpoint()`` (it raises ``AbandonedError``),
  which long-running code calls between steps; the namespace's place is given back only when
  the thread is really free, so abandoned work still counts against its namespace.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T")

DEFAULT_WORKERS = 4
DEFAULT_PER_NAMESPACE = 2


class AbandonedError(Exception):
    """The caller of this job stopped waiting; the job should end now."""


class _Ticket:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False


_local = threading.local()


def checkpoint() -> None:
    """Raise AbandonedError when the job running on this thread lost its caller (a no-op on
    threads that run no caller work)."""
    ticket: _Ticket | None = getattr(_local, "ticket", None)
    if ticket is not None and ticket.cancelled:
        raise AbandonedError("the caller stopped waiting")


def _call(ticket: _Ticket, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    _local.ticket = ticket
    try:
        return fn(*args)
    finally:
        _local.ticket = None


@dataclass
class _Gate:
    """One namespace's places: how many jobs hold a thread, and who waits for one."""

    running: int = 0
    waiting: collections.deque[asyncio.Future[None]] = field(default_factory=collections.deque)


class CallerWork:
    """The pool (the module's docstring)."""

    def __init__(self, workers: int = DEFAULT_WORKERS, per_namespace: int = DEFAULT_PER_NAMESPACE) -> None:
        self.workers = workers
        self.per_namespace = per_namespace
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, "acp-caller-work")
        # Namespaces with a job running or waiting (dropped when idle: bounded by the work).
        self._gates: dict[str, _Gate] = {}
        self._lock = threading.Lock()

    def running(self, namespace: str) -> int:
        """How many of ``namespace``'s jobs hold a thread now (abandoned ones included)."""
        with self._lock:
            gate = self._gates.get(namespace)
            return 0 if gate is None else gate.running

    async def run(self, namespace: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the pool once ``namespace`` has a place; cancelling the caller
        cancels the wait, or tells the job through ``checkpoint``."""
        loop = asyncio.get_running_loop()
        await self._enter(namespace, loop)
        ticket = _Ticket()
        try:
            job = self._pool.submit(_call, ticket, fn, args)
        except BaseException:
            self._leave(namespace)
            raise
        job.add_done_callback(lambda _: self._leave(namespace))
        try:
            return await asyncio.wrap_future(job)
        except asyncio.CancelledError:
            ticket.cancelled = True
            job.cancel()
            raise

    async def _enter(self, namespace: str, loop: asyncio.AbstractEventLoop) -> None:
        with self._lock:
            gate = self._gates.setdefault(namespace, _Gate())
            if gate.running < self.per_namespace and not gate.waiting:
                gate.running += 1
                return
            turn: asyncio.Future[None] = loop.create_future()
            gate.waiting.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            with self._lock:
                if turn.done() and not turn.cancelled():
                    # Handed a place just as the caller left: pass it on.
                    self._release(namespace, gate)
                elif turn in gate.waiting:
                    gate.waiting.remove(turn)
                    self._forget(namespace, gate)
                # Otherwise a place is on its way to it (``_grant``), which passes it on.
            raise

    def _leave(self, namespace: str) -> None:
        """A job's thread is free (any thread): give its place to the next waiter."""
        with self._lock:
            gate = self._gates.get(namespace)
            if gate is not None:
                self._release(namespace, gate)

    def _release(self, namespace: str, gate: _Gate) -> None:
        while gate.waiting:
            turn = gate.waiting.popleft()
            if not turn.done():
                turn.get_loop().call_soon_threadsafe(self._grant, turn, namespace)
                return
        gate.running -= 1
        self._forget(namespace, gate)

    def _grant(self, turn: asyncio.Future[None], namespace: str) -> None:
        """On the waiter's loop: its turn came (or, if it left meanwhile, the next one's)."""
        if turn.done():
            self._leave(namespace)
        else:
            turn.set_result(None)

    def _forget(self, namespace: str, gate: _Gate) -> None:
        if gate.running <= 0 and not gate.waiting and self._gates.get(namespace) is gate:
            del self._gates[namespace]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


# One pool per process: what it bounds is this process's threads.
CALLER_WORK = CallerWork()
