"""How webhooks are delivered, from the environment (docs/webhooks.md, "Settings")."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from cleveragents.acp.facade.domain.webhooks.sender import Limits

# Seconds to wait before the 2nd, 3rd, ... attempt of a message: 5 s, 30 s, 2 min, 10 min,
# 30 min, 1 h, 2 h, 4 h, 8 h (the last repeats); about 16 hours in all before the 10th
# consecutive failure disables the subscription.
DEFAULT_SCHEDULE = (5.0, 30.0, 120.0, 600.0, 1800.0, 3600.0, 7200.0, 14400.0, 28800.0)
DEFAULT_MAX_FAILURES = 10


@dataclass(frozen=True)
class DeliverySettings:
    schedule: tuple[float, ...] = DEFAULT_SCHEDULE
    max_failures: int = DEFAULT_MAX_FAILURES
    # A deliverer that stops renewing loses its subscriptions after this long.
    lease_seconds: float = 10.0
    # How often every process looks for subscriptions nobody delivers, and a deliverer with
    # nothing to send looks for changes another process made.
    scan_seconds: float = 1.0
    limits: Limits = field(default_factory=Limits)

    def delay(self, failures: int) -> float:
        """Seconds before the next attempt after ``failures`` consecutive failures (>= 1)."""
        return self.schedule[min(failures, len(self.schedule)) - 1]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DeliverySettings:
        """``$ACP_WEBHOOK_RETRY_SCHEDULE`` (comma-separated seconds),
        ``$ACP_WEBHOOK_MAX_FAILURES``, ``$ACP_WEBHOOK_LEASE_SECONDS``,
        ``$ACP_WEBHOOK_SCAN_SECONDS``, ``$ACP_WEBHOOK_CONNECT_SECONDS``,
        ``$ACP_WEBHOOK_TIMEOUT_SECONDS`` (a whole request)."""
        env = os.environ if environ is None else environ
        schedule: tuple[float, ...] = DEFAULT_SCHEDULE
        raw = env.get("ACP_WEBHOOK_RETRY_SCHEDULE", "").strip()
        if raw:
            try:
                schedule = tuple(float(part) for part in raw.split(","))
            except ValueError:
                raise ValueError(
                    f"$ACP_WEBHOOK_RETRY_SCHEDULE must be seconds separated by commas, not {raw!r}"
                ) from None
            if not all(0 <= delay <= 86400 for delay in schedule):
                raise ValueError("$ACP_WEBHOOK_RETRY_SCHEDULE's delays must be in [0, 86400]")
        return cls(
            schedule=schedule,
            max_failures=int(_number(env, "ACP_WEBHOOK_MAX_FAILURES", DEFAULT_MAX_FAILURES, 1, 1000)),
            lease_seconds=_number(env, "ACP_WEBHOOK_LEASE_SECONDS", 10.0, 0.5, 3600),
            scan_seconds=_number(env, "ACP_WEBHOOK_SCAN_SECONDS", 1.0, 0.05, 60),
            limits=Limits(
                connect_seconds=_number(env, "ACP_WEBHOOK_CONNECT_SECONDS", 5.0, 0.1, 60),
                total_seconds=_number(env, "ACP_WEBHOOK_TIMEOUT_SECONDS", 15.0, 0.1, 300),
            ),
        )


def _number(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"${name} must be a number, not {raw!r}") from None
    if not low <= value <= high:
        raise ValueError(f"${name} must be in [{low:g}, {high:g}], not {value:g}")
    return value
