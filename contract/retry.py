"""Retrying a call whose server could not be reached or was lost, with the same request id.

The client transports (HTTP and gRPC) call once; what is retried is a ``TransportError`` (no
ACP server answered) and an error the server marks ``details.retryable`` (it says nothing
happened, or the first call of this request id still runs: STORE_BUSY, REQUEST_IN_PROGRESS),
and only when a second attempt cannot do harm:

- the request never left (``details["sent"]`` is False: connection refused, name not
  resolved, gRPC's "failed to connect"): nothing happened, so any operation is retried;
- the operation is read-only (``option idempotency_level = NO_SIDE_EFFECTS``): retried;
- a mutating request that may have reached the server (reset or closed after it was sent)
  is retried with ``after_send`` (the default): the server answers a repeated request id
  with the first call's stored answer (docs/idempotency.md), so the retry learns what
  happened instead of doing it twice. Turn it off against a server that does not replay.

Attempts are bounded (``attempts``, the first included), spaced by exponential backoff with
jitter, and the retrying ends ``deadline`` seconds after the first failure: the last pause is
cut short so that the last attempt starts at the deadline, and the default attempts outlast
any default deadline's worth of pauses, so a client rides out ``deadline`` seconds of outage
(a restart, a failover), as docs/server.md says. The last error is raised with
``details["attempts"]``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, TypeVar

from cleveragents.acp.contract.errors import ACPError, TransportError

if TYPE_CHECKING:
    # Only a type: the CLI reads its retry settings (``connect``) without the catalog.
    from cleveragents.acp.contract.catalog import Operation

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Retrying:
    """One retry about to happen, for a caller that shows it (``RetryPolicy.notify``)."""

    operation: str
    error: ACPError
    # The attempt about to start (2 is the first retry) and the bound.
    attempt: int
    attempts: int
    delay: float


@dataclass(frozen=True)
class RetryPolicy:
    """How a client transport retries a call it could not complete (module docstring)."""

    # Attempts in all, the first included: 1 turns retrying off. 16: the deadline, not the
    # count, ends the default retrying (15 pauses of at least half their ceiling: 23.9 s).
    attempts: int = 16
    # Seconds after the first failure after which no attempt starts.
    deadline: float = 20.0
    # The first delay; each next one doubles, up to ``max_backoff``; each is jittered
    # between half and all of it, so clients a restart dropped together come back apart.
    backoff: float = 0.25
    max_backoff: float = 4.0
    # Retry a mutating call that may have reached the server (safe: the server replays by
    # request id, docs/idempotency.md).
    after_send: bool = True
    # Told before each retry (the CLI prints a line on a terminal).
    notify: Callable[[Retrying], None] | None = None

    OFF: ClassVar[RetryPolicy]

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1 (1: no retry), not {self.attempts}")
        if self.deadline < 0 or self.backoff < 0 or self.max_backoff < 0:
            raise ValueError("deadline, backoff and max_backoff must not be negative")

    @property
    def enabled(self) -> bool:
        return self.attempts > 1

    def delay(self, retry: int, rand: Callable[[], float] = random.random) -> float:
        """The pause before retry number ``retry`` (0 for the first): equal jitter."""
        ceiling = min(self.max_backoff, self.backoff * 2.0 ** min(retry, 62))
        return ceiling / 2 + ceiling / 2 * rand()

    def may_retry(self, op: Operation, error: ACPError) -> bool:
        """Whether another attempt of ``op`` is harmless after ``error`` (module docstring)."""
        if not retryable(error):
            return False
        if error.details.get("sent") is False or op.read_only:
            return True
        return self.after_send


def retryable(error: ACPError) -> bool:
    """An error another attempt may get past: the server was not reached or lost (unless
    the cause lasts: a refused certificate, the caller's own timeout), or the server said so."""
    if isinstance(error, TransportError):
        return error.details.get("retryable") is not False
    return error.details.get("retryable") is True


RetryPolicy.OFF = RetryPolicy(attempts=1)


async def with_retry(policy: RetryPolicy, op: Operation, attempt: Callable[[], Awaitable[T]]) -> T:
    """``attempt`` once, and again as ``policy`` allows when it fails with an error another
    attempt may get past: what each client transport does around its calls and streams."""
    try:
        return await attempt()
    except ACPError as exc:
        if not (policy.enabled and retryable(exc)):
            raise
        return await again(policy, op, exc, attempt)


async def again(
    policy: RetryPolicy,
    op: Operation,
    failed: ACPError,
    attempt: Callable[[], Awaitable[T]],
    *,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """Retry ``attempt`` after the first attempt failed with ``failed``: the caller's
    success path pays nothing. Raises the last error once the policy says stop."""
    started = clock()
    error = failed
    made = 1
    while made < policy.attempts and policy.may_retry(op, error):
        pause = policy.delay(made - 1)
        left = policy.deadline - (clock() - started)
        if left <= 0:
            break
        # The last attempt starts at the deadline, not a whole backoff before it.
        pause = min(pause, left)
        if policy.notify is not None:
            policy.notify(Retrying(op.name, error, made + 1, policy.attempts, pause))
        log.info("%s: %s; retrying in %.2f s (attempt %d)", op.name, error.message, pause, made + 1)
        await sleep(pause)
        made += 1
        try:
            return await attempt()
        except ACPError as exc:
            if not retryable(exc):
                raise
            error = exc
    error.details["attempts"] = made
    raise error
