"""``LeaseKeeper``: the plan leases this process holds, kept alive while it works.

Execution is leased (leases.py): the process running a plan, or writing its project,
holds the plan's lease, and every write it makes for the plan is fenced by the lease's
token. The keeper claims and releases them, and renews them (the heartbeat) every third of
the lease while it holds any. A lease found lost, or a cancel another process left on it,
stops the plan's run here (``Cancels``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable

from cleveragents.acp.facade.domain.plans import leases
from cleveragents.acp.facade.domain.plans.halts import Cancels
from cleveragents.acp.facade.domain.plans.leases import PlanLeases
from cleveragents.acp.facade.store.base import Lease, LeaseLostError, Store, StoreBusyError

log = logging.getLogger(__name__)

# A cross-process cancel, left on the plan's lease for its holder (leases.py).
CANCEL_REQUEST = "cancel:"


def _lease_of(name: str, store: Store) -> Lease | None:
    return store.get_lease(name)


async def every(
    store: Store, interval: float, work: Callable[[], Awaitable[None]], *, first_wait: bool = False
) -> None:
    """``work`` every ``interval``; a store outage is one line when it starts (and one
    when it ends), not a traceback each time."""
    if first_wait:
        await asyncio.sleep(interval)
    down = False
    while True:
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            outage = store.outage(exc)
            if outage is not None:
                if not down:
                    log.warning(
                        "plan leases: %s cannot reach the store (%s); retrying every %g s",
                        work.__name__,
                        outage,
                        interval,
                    )
            elif isinstance(exc, StoreBusyError):
                # Another process's lock (one frozen inside a transaction, until the store
                # ends it): expected while it lasts, not a fault of this process.
                log.warning("plan leases: %s waits for a lock (%s); trying again", work.__name__, exc)
            else:
                log.exception("plan leases: %s failed; trying again", work.__name__)
            down = outage is not None
        else:
            if down:
                log.warning("plan leases: %s reaches the store again", work.__name__)
            down = False
        await asyncio.sleep(interval)


class LeaseKeeper:
    def __init__(self, store: Store, plan_leases: PlanLeases, cancels: Cancels) -> None:
        self.store = store
        self.leases = plan_leases
        self.cancels = cancels
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def heartbeat(self) -> asyncio.Task[None] | None:
        """The task renewing this process's leases, while it holds any."""
        return self._heartbeat_task

    def take(self, plan_id: str) -> None:
        """In a write: claim the plan's lease (PLAN_LEASED if another process holds it)."""
        if not self.leases.claim(plan_id):
            raise leases.busy(plan_id)

    async def release(self, plan_id: str) -> None:
        if self.leases.holds(plan_id):
            await self.store.write(lambda _store: self.leases.release(plan_id))
        self.stop_heartbeat_if_idle()

    def start_heartbeat(self) -> None:
        """Renew this engine's leases every third of the lease while it holds any. A store
        error is logged and tried again: a lease is lost only when it expires."""
        if (self._heartbeat_task is None or self._heartbeat_task.done()) and not self._closed:
            self._heartbeat_task = asyncio.get_running_loop().create_task(
                every(self.store, self.leases.ttl / 3, self._heartbeat, first_wait=True),
                name="plan-lease-heartbeat",
            )

    def stop_heartbeat_if_idle(self) -> None:
        if not self.leases.held and self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            self._heartbeat_task = None

    async def _heartbeat(self) -> None:
        if not self.leases.held:
            return
        lost, requests = await self.store.write(self.leases.renew)
        for plan_id in lost:
            name, token = leases.lease_name(plan_id), self.leases.held.get(plan_id, 0)
            current = await self.store.read(functools.partial(_lease_of, name))
            log.warning("plan %s stops here: %s", plan_id, LeaseLostError(name, token, current))
            self.cancels.stop(plan_id, "the plan's lease was lost")
        for plan_id, request in requests.items():
            self.requested(plan_id, request)

    def requested(self, plan_id: str, request: str) -> None:
        """What another process left on a lease this one holds (a cancel)."""
        if request.startswith(CANCEL_REQUEST):
            self.cancels.stop(plan_id, request[len(CANCEL_REQUEST) :] or "cancelled")

    def closing(self) -> None:
        """The engine closes: no heartbeat starts from now on."""
        self._closed = True

    async def close(self) -> None:
        """Stop the heartbeat and the leases (after the plans this process ran stopped)."""
        self._closed = True
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat_task
        self.leases.close()
