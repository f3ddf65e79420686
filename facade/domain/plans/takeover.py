"""``Takeover``: settling the plans of processes that stopped.

When a plan's holder dies, whoever takes the lease over settles the plan as a stopped
server's is settled at start (``recover``): an apply half-written is undone from its
checkpoint, a rollback half-done is finished, and a plan left running is failed with
reason ``interrupted``. A server (``takeover``) scans for such leases while it is open.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable
from typing import TypeVar

from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.plans import apply, leases, model, records, setup
from cleveragents.acp.facade.domain.plans.apply import Restored
from cleveragents.acp.facade.domain.plans.leasing import LeaseKeeper, every
from cleveragents.acp.facade.domain.plans.project_files import PlanFiles
from cleveragents.acp.facade.domain.plans.recording import STOPPED_RUNNING, PlanRecorder
from cleveragents.acp.facade.domain.plans.records import CheckpointEntry
from cleveragents.acp.facade.domain.plans.running import PlanRunner
from cleveragents.acp.facade.store.base import Lease, Record, Store, StoreBusyError
from cleveragents.acp.v1 import common_pb2, plan_pb2, registry_pb2

log = logging.getLogger(__name__)
T = TypeVar("T")

# How long ``recover`` waits out the locks of a process that stopped inside a transaction
# (a PostgreSQL replica frozen there keeps them at most $ACP_STORE_IDLE_TRANSACTION_SECONDS,
# 10 by default: pg_settings.py); then STORE_BUSY, as before it waited.
RECOVERY_PATIENCE = 60.0
STOPPED_APPLYING = "the server stopped during apply; every file was restored"
# Settling a plan whose holder stopped: pre-images to restore, then a transition to record.
Settlement = tuple[list[CheckpointEntry], Callable[[], None]]


def _patiently(store: Store, work: Callable[[], T], deadline: float) -> T:
    """``work`` in a transaction of its own, blocking, tried again (backing off) while a
    lock another process holds makes it STORE_BUSY, until ``deadline`` (monotonic)."""
    delay = 0.05
    while True:
        try:
            with store.transaction():
                return work()
        except StoreBusyError as exc:
            if time.monotonic() + delay >= deadline:
                raise
            log.warning(
                "plan recovery waits for a lock another process holds (%s); again in %.2f s", exc, delay
            )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)


def _log_skipped(plan_id: str, outcome: Restored) -> None:
    """Settling a stopped apply restores what it can reach: a path whose folder is now
    outside the operator's roots, or behind a symlink, is left alone and said here."""
    if outcome.skipped:
        log.error(
            "plan %s: not restored (a folder on the way is a symlink or a file, or lies outside "
            "the resource roots now; never followed): %s",
            plan_id,
            ", ".join(outcome.skipped),
        )


class Takeover:
    def __init__(
        self, recorder: PlanRecorder, keeper: LeaseKeeper, runner: PlanRunner, files: PlanFiles
    ) -> None:
        self.recorder = recorder
        self.store = recorder.store
        self.records = recorder.records
        self.registries = recorder.registries
        self.keeper = keeper
        self.leases = keeper.leases
        self.runner = runner
        self.files = files
        self._scanner: asyncio.Task[None] | None = None
        # Plans whose resources this process could not see, already logged.
        self._unseen: set[str] = set()

    def start_scanner(self) -> None:
        """Scan for leases whose holder stopped (once), on the running loop."""
        if self._scanner is None:
            interval = min(1.0, self.leases.ttl / 4)
            self._scanner = asyncio.get_running_loop().create_task(
                every(self.store, interval, self._scan), name="plan-lease-scanner"
            )

    def recover(self) -> None:
        """At start, before any call (blocking): settle what stopped processes left, the
        plans in flight whose lease is free, expired, or held by a process that is gone.
        A live holder's plans are its own business; the scanner takes them if it dies. A
        lock a stalled process holds (STORE_BUSY) is waited out, up to RECOVERY_PATIENCE."""
        deadline = time.monotonic() + RECOVERY_PATIENCE
        candidates = {r.id for r in self.records.in_flight()}
        candidates.update(leases.plan_of(lease.name) for lease in self.leases.takeable(self.store))
        for plan_id in sorted(candidates):
            lease = self.store.get_lease(leases.lease_name(plan_id))
            if lease is not None and lease.live and leases.steal_token(lease) is None:
                continue
            record = self.store.get(records.KIND, plan_id)
            if record is not None and self._unseen_folder(record) is not None:
                continue

            def claim(plan_id: str = plan_id, lease: Lease | None = lease) -> tuple[bool, Record | None]:
                if not self.leases.claim(plan_id, steal_token=leases.steal_token(lease)):
                    return False, None
                return True, self.store.get(records.KIND, plan_id)

            try:
                claimed, record = _patiently(self.store, claim, deadline)
            except BaseException:
                self.leases.forget(plan_id)
                raise
            if not claimed:
                continue
            try:
                entries, finish = self._settlement(record)
                if entries and record is not None:
                    _log_skipped(
                        plan_id, apply.restore_all(entries, self.files.anchors(record.namespace, entries))
                    )
                _patiently(self.store, finish, deadline)
            finally:
                _patiently(self.store, functools.partial(self.leases.release, plan_id), deadline)

    def _settlement(self, record: Record | None) -> Settlement:
        """What settling a plan whose holder stopped takes: the pre-images to restore first
        (off the loop), then the transition to record (in a transaction)."""
        if record is None or not records.unsettled(record):
            return [], lambda: None
        plan = plan_pb2.Plan.FromString(record.body)
        journal = record.attrs.get("journal", "")
        transition = self.recorder.transition
        if journal == records.JOURNAL_APPLYING:

            def aborted() -> None:
                transition(
                    plan,
                    model.APPLY,
                    model.FAILED,
                    reason=model.INTERRUPTED,
                    error=common_pb2.ErrorInfo(code=model.INTERRUPTED, message=STOPPED_APPLYING),
                    journal=records.JOURNAL_ABORTED,
                )

            return self.records.checkpoint(plan.meta.id), aborted
        if journal == records.JOURNAL_ROLLING_BACK:

            def rolled_back() -> None:
                transition(
                    plan,
                    model.APPLY,
                    model.ROLLED_BACK,
                    reason="rollback",
                    journal=records.JOURNAL_ROLLED_BACK,
                )

            return self.records.checkpoint(plan.meta.id), rolled_back
        return [], lambda: self.recorder.interrupted(plan, STOPPED_RUNNING)

    def _unseen_folder(self, record: Record) -> str | None:
        """Blocking (it stats folders): a folder of the plan's that this process cannot see,
        so it must not take the plan over (a restore would silently skip it). Every process
        on one database must see each resource at the same path (docs/plans.md)."""
        if not records.unsettled(record):
            return None
        if record.attrs.get("journal") in (records.JOURNAL_APPLYING, records.JOURNAL_ROLLING_BACK):
            folders = [entry.root for entry in self.records.checkpoint(record.id)]
        else:
            plan = plan_pb2.Plan.FromString(record.body)
            try:
                project = self.registries.fetch(registry_pb2.Project, plan.meta.namespace, plan.project)
                roots = setup.resources_of(self.registries, plan.meta.namespace, project)
            except ACPError:
                return None
            folders = [str(root.root) for root in roots.values()]
        for folder in folders:
            if not os.path.isdir(folder):
                if record.id not in self._unseen:
                    self._unseen.add(record.id)
                    log.error(
                        "plan %s: not taking it over: its resource folder %s is not visible to this "
                        "process (every server process on one database must see each resource at "
                        "the same path); another process that sees it will",
                        record.id,
                        folder,
                    )
                return folder
        self._unseen.discard(record.id)
        return None

    async def _scan(self) -> None:
        found = await self.store.read(lambda store: store.held_leases(leases.PREFIX, leases.SCAN_LIMIT))
        for lease in found:
            if lease.owner == self.leases.owner and lease.request:
                self.keeper.requested(leases.plan_of(lease.name), lease.request)
        for lease in self.leases.takeable(found):
            await self.take_over(lease)

    async def take_over(self, lease: Lease) -> bool:
        """Claim a takeable lease and settle its plan as ``recover`` does; False when this
        process cannot see the plan's folders or another process claimed it first."""
        plan_id = leases.plan_of(lease.name)
        if self.runner.task(plan_id) is not None or self.files.busy(plan_id) or self.leases.holds(plan_id):
            return False
        record = await self.store.read_get(records.KIND, plan_id)
        if record is not None and await asyncio.to_thread(self._unseen_folder, record) is not None:
            return False
        steal = leases.steal_token(lease)

        def claim(store: Store) -> Settlement | None:
            if not self.leases.claim(plan_id, steal_token=steal):
                return None
            return self._settlement(store.get(records.KIND, plan_id))

        try:
            settlement = await self.store.write(claim)
        except BaseException:
            self.leases.forget(plan_id)
            raise
        if settlement is None:
            return False
        self.keeper.start_heartbeat()
        entries, finish = settlement
        try:
            with self.files.working(plan_id):
                if entries and record is not None:
                    anchors = await asyncio.to_thread(self.files.anchors, record.namespace, entries)
                    _log_skipped(plan_id, await asyncio.to_thread(apply.restore_all, entries, anchors))
                await self.store.write(lambda _store: finish())
                log.warning(
                    "plan %s: taken over from a stopped process (lease token %d)", plan_id, lease.token
                )
        finally:
            await self.store.write(lambda _store: self.leases.release(plan_id))
            self.keeper.stop_heartbeat_if_idle()
        return True

    async def close(self) -> None:
        """Stop the scanner."""
        if self._scanner is not None:
            self._scanner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scanner
