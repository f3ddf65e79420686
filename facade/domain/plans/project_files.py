"""``PlanFiles``: Apply and rollback, the work that changes a project's files.

Invariants are checked first; then every pre-image is checkpointed and the artifacts are
written (apply.py), or the checkpoint is restored (rollback). The file work runs on a
worker thread, one apply or rollback per plan at a time, shielded so a caller that goes
away leaves nothing half-done, under the plan's lease: the writer checks it before each
file (``Fence``), and a process that takes the lease over restores the checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.beneath import Anchor
from cleveragents.acp.facade.domain.plans import (
    apply,
    approvals,
    diff,
    invariants,
    leases,
    model,
    records,
    rollback,
    setup,
)
from cleveragents.acp.facade.domain.plans.apply import Fence, Restored, Write
from cleveragents.acp.facade.domain.plans.approvals import ApprovalGate
from cleveragents.acp.facade.domain.plans.leasing import LeaseKeeper
from cleveragents.acp.facade.domain.plans.recording import PlanRecorder
from cleveragents.acp.facade.domain.plans.records import CheckpointEntry
from cleveragents.acp.facade.store.base import LeaseLostError
from cleveragents.acp.v1 import common_pb2, events_pb2, plan_pb2

log = logging.getLogger(__name__)


class PlanFiles:
    def __init__(self, recorder: PlanRecorder, keeper: LeaseKeeper, gate: ApprovalGate) -> None:
        self.recorder = recorder
        self.gate = gate
        self.records = recorder.records
        self.registries = recorder.registries
        self.keeper = keeper
        # Plans whose files are being applied or rolled back on a worker thread.
        self._file_work: set[str] = set()

    def busy(self, plan_id: str) -> bool:
        """The plan's files are being applied, rolled back or restored here."""
        return plan_id in self._file_work

    @contextlib.contextmanager
    def working(self, plan_id: str) -> Iterator[None]:
        """Mark the plan's files as in work (a takeover restoring them) while this lasts."""
        self._file_work.add(plan_id)
        try:
            yield
        finally:
            self._file_work.discard(plan_id)

    @contextlib.contextmanager
    def _exclusive(self, plan_id: str) -> Iterator[None]:
        """One file operation (apply, rollback) per plan at a time: they run off the loop."""
        if plan_id in self._file_work:
            raise ACPError(
                ErrorCode.INVALID_STATE,
                f"plan {plan_id} is being applied or rolled back",
                {"plan_id": plan_id},
            )
        with self.working(plan_id):
            yield

    # plan.apply -------------------------------------------------------------------------

    async def apply(
        self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup, diff_digest: str = ""
    ) -> list[str]:
        """Refusals leave the plan's state as it was and record the error. The file work
        (reads, fsyncs) runs on a worker thread, one apply or rollback per plan, shielded:
        a caller that goes away does not leave the plan half-applied. An apply the approval
        policy holds writes nothing and answers no paths: the plan awaits approval."""
        try:
            return await asyncio.shield(self._apply_exclusive(plan, plan_setup, diff_digest))
        except approvals.PausedError:
            return []

    async def _apply_exclusive(
        self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup, diff_digest: str
    ) -> list[str]:
        with self._exclusive(plan.meta.id):
            return await self._apply_files(plan, plan_setup, diff_digest)

    async def _prepare_apply(
        self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup, diff_digest: str
    ) -> list[Write]:
        """Invariants first (every violation listed), then the writes and their checkpoint.

        Reading the staged files and matching the invariants (a forbid_regex over every
        file's content) runs on a worker thread: a big plan's check holds no other call."""
        staging, checks = await self.recorder.read(
            lambda: (
                self.recorder.staging(plan, plan_setup),
                setup.invariants(self.registries, plan.meta.namespace, plan_setup.action),
            )
        )
        artifacts, found = await asyncio.to_thread(invariants.check, checks, staging.artifacts)
        # The very artifacts the writes below are made from: nothing staged later can slip in.
        diff.check_digest(plan.meta.id, diff_digest, artifacts)
        if found:
            message = f"apply refused: {len(found)} invariant violation(s): " + "; ".join(found)
            raise ACPError(ErrorCode.INVALID_STATE, message, {"plan_id": plan.meta.id, "violations": found})
        if self.gate.asks(plan_setup.profile.approval):
            text = "".join(diff.file_diff(a).unified_diff for a in artifacts)
            gate = await self.gate.apply(plan, plan_setup, diff.digest(artifacts), text)
            if gate.approval is not None:
                raise approvals.PausedError(gate.approval)
            if gate.rejected:
                raise ACPError(
                    ErrorCode.INVALID_STATE,
                    f"apply refused: {gate.rejected}",
                    {"plan_id": plan.meta.id},
                    refinement="APPROVAL_REJECTED",
                )
        return await asyncio.to_thread(apply.prepare, artifacts, plan_setup.resources)

    async def _apply_files(
        self, plan: plan_pb2.Plan, plan_setup: setup.PlanSetup, diff_digest: str
    ) -> list[str]:
        try:
            writes = await self._prepare_apply(plan, plan_setup, diff_digest)
        except ACPError as exc:
            if exc.details.get("refinement") == "DIFF_CHANGED" or exc.details.get("field") == "diff_digest":
                # A refused digest or bad input: the caller's, nothing of the plan's to record.
                raise
            refused = common_pb2.ErrorInfo(code=exc.code, message=exc.message)
            await self.recorder.write(lambda: self.recorder.record_error(plan, refused))
            raise
        entries = [w.entry for w in writes]

        def begin() -> None:
            self.recorder.still(plan, "apply")
            self.records.save_checkpoint(plan.meta.id, entries)
            plan.ClearField("last_error")
            self.recorder.transition(plan, model.APPLY, model.RUNNING, journal=records.JOURNAL_APPLYING)

        try:
            async with self._leased_file_work(plan.meta.id, begin):
                return await self._write_files(plan, writes, entries)
        except LeaseLostError as exc:
            # Taken over mid-apply: the new holder restores the checkpoint; nothing is ours.
            log.warning("plan %s: apply stopped: %s", plan.meta.id, exc)
            raise leases.lost(plan.meta.id, exc) from None

    @contextlib.asynccontextmanager
    async def _leased_file_work(self, plan_id: str, begin: Callable[[], None]) -> AsyncIterator[None]:
        """The plan's lease around an apply's or rollback's file work: claimed in the write
        that runs ``begin`` (forgotten if that write fails), renewed by the heartbeat while
        the files change, released after. A run's auto-apply already holds the run's lease,
        which stays the run's to release."""
        claimed = not self.keeper.leases.holds(plan_id)

        def leased() -> None:
            if claimed:
                self.keeper.take(plan_id)
            begin()

        try:
            await self.recorder.write(leased)
        except BaseException:
            if claimed:
                self.keeper.leases.forget(plan_id)
            raise
        self.keeper.start_heartbeat()
        try:
            yield
        finally:
            if claimed:
                await self.keeper.release(plan_id)

    async def _write_files(
        self, plan: plan_pb2.Plan, writes: list[Write], entries: list[CheckpointEntry]
    ) -> list[str]:
        try:
            await asyncio.to_thread(apply.write_all, writes, self._file_fence(plan.meta.id))
        except OSError as exc:
            undone = await asyncio.to_thread(apply.restore_all, entries, apply.anchors_of(writes))
            raise await self._apply_failed(plan, exc, undone) from None
        changed = [e.path for e in entries]
        completed = events_pb2.PlanApplyCompleted(changed_paths=changed, checkpoint_id=plan.meta.id)
        await self.recorder.write(
            lambda: self.recorder.transition(
                plan,
                model.APPLY,
                model.SUCCEEDED,
                journal=records.JOURNAL_APPLIED,
                before=[{"plan_apply_completed": completed}],
            )
        )
        return changed

    def _file_fence(self, plan_id: str) -> Fence:
        """For the worker thread writing the files: LeaseLostError once this engine no
        longer holds the plan's lease (asked of the store, through the loop)."""
        loop = asyncio.get_running_loop()
        store, plan_leases = self.recorder.store, self.keeper.leases

        def fence() -> None:
            check = store.read(lambda store: plan_leases.check(store, plan_id))
            asyncio.run_coroutine_threadsafe(check, loop).result()

        return fence

    async def _apply_failed(self, plan: plan_pb2.Plan, exc: OSError, undone: Restored) -> ACPError:
        """Record the failed apply (undone) on the plan and return the error to raise: a
        folder swapped for a symlink under the plan is the caller's INVALID_STATE
        (``PATH_CROSSES_SYMLINK``), any other I/O failure the server's INTERNAL_ERROR."""
        code, refinement = ErrorCode.INTERNAL_ERROR, None
        details: dict[str, object] = {"plan_id": plan.meta.id}
        message = f"apply failed and was undone: {exc}"
        if isinstance(exc, apply.CrossedLinkError):
            code, refinement = ErrorCode.INVALID_STATE, "PATH_CROSSES_SYMLINK"
            details["path"] = exc.path
            message = (
                f"apply stopped at {exc.path!r}: a folder on the way is now a symlink or a file "
                "(never followed); every file written was undone"
            )
        if undone.skipped:
            details["skipped_paths"] = undone.skipped
            message += f", except {', '.join(undone.skipped)} (a folder on the way is now a symlink)"
        failed = common_pb2.ErrorInfo(code=ErrorCode.Name(code), message=message)
        await self.recorder.write(
            lambda: self.recorder.transition(
                plan, model.APPLY, model.FAILED, error=failed, journal=records.JOURNAL_ABORTED
            )
        )
        return ACPError(code, message, details, refinement=refinement)

    # plan.rollback ----------------------------------------------------------------------

    async def rollback(self, plan: plan_pb2.Plan, entries: list[CheckpointEntry], force: bool) -> Restored:
        """Off the loop and shielded, like apply."""
        return await asyncio.shield(self._rollback_files(plan, entries, force))

    async def _rollback_files(
        self, plan: plan_pb2.Plan, entries: list[CheckpointEntry], force: bool
    ) -> Restored:
        with self._exclusive(plan.meta.id):
            anchors = await asyncio.to_thread(self.anchors, plan.meta.namespace, entries, refuse=True)
            await asyncio.to_thread(rollback.check, plan.meta.id, entries, anchors, force=force)

            def begin() -> None:
                self.recorder.still(plan, "rollback")
                self.records.save(plan, journal=records.JOURNAL_ROLLING_BACK)

            async with self._leased_file_work(plan.meta.id, begin):
                restored = await asyncio.to_thread(apply.restore_all, entries, anchors)
                # Paths never followed through a symlink are not restored: the plan says so.
                skipped = (
                    common_pb2.ErrorInfo(
                        code=ErrorCode.Name(ErrorCode.INVALID_STATE),
                        message=f"rolled back except {', '.join(restored.skipped)}: a folder on the "
                        "way is now a symlink or a file (never followed); those are left as they are",
                    )
                    if restored.skipped
                    else None
                )
                await self.recorder.write(
                    lambda: self.recorder.transition(
                        plan,
                        model.APPLY,
                        model.ROLLED_BACK,
                        reason="rollback",
                        error=skipped,
                        journal=records.JOURNAL_ROLLED_BACK,
                    )
                )
        return restored

    def anchors(
        self, namespace: str, entries: Sequence[CheckpointEntry], *, refuse: bool = False
    ) -> dict[str, Anchor | None]:
        """Blocking: where each checkpoint folder is opened from, checked against the
        operator's resource roots as they are now (None: outside them, never touched). With
        ``refuse``, INVALID_STATE naming the first such folder instead."""
        found: dict[str, Anchor | None] = {}
        for entry in entries:
            if entry.root in found:
                continue
            anchor = self.registries.policy.anchor(namespace, entry.root)
            if anchor is None and refuse:
                raise ACPError(
                    ErrorCode.INVALID_STATE,
                    f"resource folder {entry.root} lies outside the server's resource roots for "
                    f"namespace {namespace!r} now; nothing was done",
                    {"path": entry.root, "resource": entry.resource},
                )
            found[entry.root] = anchor
        return found
