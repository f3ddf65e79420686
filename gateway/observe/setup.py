"""What a server's observability is made of, built once per server from its settings."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from cleveragents.acp.gateway.observe import tracing
from cleveragents.acp.gateway.observe.endpoints import Readiness
from cleveragents.acp.gateway.observe.logs import Logging
from cleveragents.acp.gateway.observe.metrics import Metrics, Sampler
from cleveragents.acp.gateway.observe.telemetry import CallTelemetry


@dataclass
class Observability:
    metrics: Metrics = field(default_factory=Metrics)
    readiness: Readiness = field(default_factory=Readiness)
    # None: the embedder keeps its own logging (tests, an application mounting the gateway).
    logging: Logging | None = None
    # None: /metrics on the HTTP port for loopback clients; else a listener of its own.
    metrics_port: int | None = None
    telemetry: CallTelemetry = field(init=False)

    def __post_init__(self) -> None:
        self.telemetry = CallTelemetry(self.metrics, log=self.logging)


def build(
    *,
    log_level: str = "warning",
    log_format: str = "auto",
    access_log: bool = True,
    metrics_port: int | None = None,
    manage_logging: bool = True,
    probe: Callable[[], Awaitable[object]] | None = None,
    sampler: Sampler | None = None,
) -> Observability:
    """The observability of ``agents serve`` / ``agents gateway``; tracing from ``OTEL_*``."""
    tracing.configure()
    observability = Observability(
        readiness=Readiness(probe),
        logging=Logging(level=log_level, fmt=log_format, access_log=access_log) if manage_logging else None,
        metrics_port=metrics_port,
    )
    if sampler is not None:
        observability.metrics.sample_with(sampler)
    return observability
