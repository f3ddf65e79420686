"""Plan execution leased to one process: who may write a plan while it runs or writes
its project, for how long, and who takes it over when that process dies.

A process claims a plan's lease (a conditional update in the store, on the store's
clock) in the same transaction that marks the plan running, renews it by heartbeat, and
releases it once the plan has settled. Each claim gets the next fencing token, and every
write made for the plan checks it inside the write's own transaction (``fence``): a
process whose lease was taken can write nothing more for the plan; one whose lease
merely expired, nobody having claimed it since, renews it in the write and goes on. A write
made by a process that holds no lease (a ``plan.cancel`` or ``plan.correct`` call) is
refused while another process holds one.

A scanner in every process claims leases that expired (their holder stopped renewing)
and leases whose holder is a process of this very host and kernel that no longer exists
(found through /proc, so a restarted server or a sibling ``--workers`` process takes a
killed one's plans at once, without waiting out the lease). docs/plans.md, "Leases".
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable

from ulid import ULID

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.store.base import Lease, LeaseHeldError, LeaseLostError, Store

log = logging.getLogger(__name__)

PREFIX = "plan:"
TTL_ENV = "ACP_PLAN_LEASE_SECONDS"
DEFAULT_TTL = 10.0
# The most leases one scan looks at; the rest wait for the next scan.
SCAN_LIMIT = 100
# Owner ids of this process's engines still open: a holder naming this process but none
# of these is an engine that was closed or abandoned.
_OPEN: set[str] = set()


def opened(owner: str) -> None:
    """``owner`` (from ``new_owner``) is a live holder of this process until ``closed``:
    other lease users of the store (session turns) name their holders the same way."""
    _OPEN.add(owner)


def closed(owner: str) -> None:
    _OPEN.discard(owner)


def lease_name(plan_id: str) -> str:
    return PREFIX + plan_id


def plan_of(name: str) -> str:
    return name[len(PREFIX) :]


def ttl_from_env(environ: dict[str, str] | None = None) -> float:
    """``$ACP_PLAN_LEASE_SECONDS`` (default 10): how long a silent process keeps its plans."""
    raw = (os.environ if environ is None else environ).get(TTL_ENV, "").strip()
    if not raw:
        return DEFAULT_TTL
    try:
        ttl = float(raw)
    except ValueError:
        raise ValueError(f"${TTL_ENV} must be a number of seconds, not {raw!r}") from None
    if not 0.5 <= ttl <= 3600:
        raise ValueError(f"${TTL_ENV} must be in [0.5, 3600], not {ttl:g}")
    return ttl


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as file:
            return file.read().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def _kernel() -> str:
    """This boot of this kernel and this pid namespace: where a pid means one process."""
    boot = _read("/proc/sys/kernel/random/boot_id")
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""
    return f"{boot}:{namespace}" if boot else ""


def _started(pid: int) -> str:
    """When ``pid`` started (clock ticks since boot), so a reused pid is not mistaken for it;
    '' for a process that is gone, a zombie included (dead, not yet reaped by its parent)."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat.rpartition(")")[2].split()
    if len(fields) <= 19 or fields[0] in ("Z", "X"):
        return ""
    return fields[19]


def new_owner() -> str:
    """``host|kernel|pid|start|engine``: unique per engine, and enough for a process of the
    same kernel to tell that its holder is gone."""
    pid = os.getpid()
    return "|".join((socket.gethostname(), _kernel(), str(pid), _started(pid), str(ULID())))


def holder_gone(owner: str) -> bool:
    """Whether the process named by ``owner`` surely cannot write any more: it ran under this
    kernel (same boot, same pid namespace) and has exited, or it is an engine of this
    process that was closed. Anything else (another host, container or kernel) is unknown
    and waits for the lease to expire."""
    parts = owner.split("|")
    if len(parts) != 5:
        return False
    _host, kernel, pid, started, _engine = parts
    if not kernel or kernel != _kernel() or not pid.isdigit() or not started:
        return False
    if int(pid) == os.getpid():
        return owner not in _OPEN
    return _started(int(pid)) != started


def busy(plan_id: str) -> ACPError:
    return ACPError(
        ErrorCode.INVALID_STATE,
        f"plan {plan_id} is being run by another server process, which holds its lease; "
        "retry once it settles (or cancel it)",
        {"plan_id": plan_id, "retryable": True},
        refinement="PLAN_LEASED",
    )


def holder(lease: Lease | None) -> str:
    """Who holds a lease, in words: host, process id and token."""
    if lease is None or not lease.owner:
        return "nobody (it was released)"
    parts = lease.owner.split("|")
    where = f"{parts[0]} pid {parts[2]}" if len(parts) == 5 else lease.owner
    return f"{where} (token {lease.token}{'' if lease.live else ', expired'})"


def lost(plan_id: str, exc: LeaseLostError) -> ACPError:
    """What a caller whose apply stopped because the plan was taken over is told: retry
    once the new holder settled it (the files are then as the new holder left them)."""
    return ACPError(
        ErrorCode.INVALID_STATE,
        f"plan {plan_id}: this server process lost the plan's lease (token {exc.token}) and "
        f"stopped writing; it is now held by {holder(exc.current)}, which settles the plan; "
        "retry once it has",
        {"plan_id": plan_id, "retryable": True, "holder": holder(exc.current)},
        refinement="LEASE_LOST",
    )


class PlanLeases:
    """This engine's leases: claim, fence, renew, release. The synchronous methods run
    inside a store transaction (on the store's writer thread, or a blocking caller)."""

    def __init__(self, store: Store, ttl: float) -> None:
        self.store = store
        self.ttl = ttl
        self.owner = new_owner()
        _OPEN.add(self.owner)
        # plan id -> the fencing token of the lease this engine holds on it.
        self.held: dict[str, int] = {}

    def fence(self, plan_id: str) -> None:
        """Called in every transaction that writes for a plan, before it commits: the writer
        holds the plan's lease at its token (LeaseLostError otherwise, and the transaction
        rolls back), or, holding none, nobody else does (INVALID_STATE PLAN_LEASED)."""
        token = self.held.get(plan_id)
        try:
            self.store.check_lease(lease_name(plan_id), token)
        except LeaseHeldError:
            raise busy(plan_id) from None
        except LeaseLostError as lost:
            if token is None or not self._reclaim(plan_id, token, lost.current):
                raise

    def _reclaim(self, plan_id: str, token: int, current: Lease | None) -> bool:
        """A lease of ours that expired (a heartbeat late: a busy process, a long write) but
        that nobody claimed since is still ours to write under: the transaction holds off
        every claim until it ends, so renewing it here, at the same token, fences exactly as
        a heartbeat on time would have."""
        if current is None or current.owner != self.owner or current.token != token:
            return False
        name = lease_name(plan_id)
        if name not in self.store.renew_leases(self.owner, {name: token}, self.ttl):
            return False
        log.warning(
            "plan %s: this process's lease (token %d) had expired unrenewed and nobody had "
            "claimed it; renewed, the plan goes on",
            plan_id,
            token,
        )
        return True

    def check(self, store: Store, plan_id: str) -> None:
        """LeaseLostError unless this engine still holds the plan's lease, live, at its
        token: the fence of work outside the store (file writes), as ``fence`` is of the
        store's writes, but a read."""
        token = self.held.get(plan_id, 0)
        lease = store.get_lease(lease_name(plan_id))
        if lease is None or lease.owner != self.owner or lease.token != token or not lease.live:
            raise LeaseLostError(lease_name(plan_id), token, lease)

    def claim(self, plan_id: str, *, steal_token: int | None = None) -> bool:
        """Take the plan's lease in the current transaction; False if another holds it. The
        caller drops it (``forget``) if the transaction then fails."""
        lease = self.store.claim_lease(lease_name(plan_id), self.owner, self.ttl, steal_token=steal_token)
        if lease is None:
            return False
        self.held[plan_id] = lease.token
        return True

    def holds(self, plan_id: str) -> bool:
        return plan_id in self.held

    def forget(self, plan_id: str) -> None:
        self.held.pop(plan_id, None)

    def release(self, plan_id: str) -> None:
        """Free the plan's lease (if still ours); forgotten here whatever happens."""
        token = self.held.pop(plan_id, None)
        if token is not None:
            self.store.release_lease(lease_name(plan_id), token)

    def renew(self, store: Store) -> tuple[list[str], dict[str, str]]:
        """One heartbeat (in a write): the plans whose lease was lost, and the requests
        (a cancel) left for those kept."""
        tokens = dict(self.held)
        kept = store.renew_leases(self.owner, {lease_name(p): t for p, t in tokens.items()}, self.ttl)
        # A lost plan keeps its stale token here, so its runner's next write raises
        # LeaseLostError (and stops it) rather than pass as a write holding no lease.
        lost = [plan_id for plan_id in tokens if lease_name(plan_id) not in kept]
        requests = {plan_of(name): request for name, request in kept.items() if request}
        return lost, requests

    def takeable(self, found: Store | list[Lease]) -> list[Lease]:
        """Of the held leases (or those a store has now), those of another engine that may
        be claimed now: expired, or their holder gone."""
        if isinstance(found, Store):
            found = found.held_leases(PREFIX, SCAN_LIMIT)
        return [
            lease
            for lease in found
            if lease.owner != self.owner
            and plan_of(lease.name) not in self.held
            and (not lease.live or holder_gone(lease.owner))
        ]

    def close(self) -> None:
        _OPEN.discard(self.owner)


def steal_token(lease: Lease | None) -> int | None:
    """The token to claim a live lease by, when its holder is known to be gone."""
    if lease is None or not lease.owner or not lease.live:
        return None
    return lease.token if holder_gone(lease.owner) else None


FenceHook = Callable[[str], None]
