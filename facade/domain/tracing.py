"""Spans of the domain's own work (plan runs, tool calls, model calls) and the trace id an
event carries, through the OpenTelemetry API only.

Without an SDK installed and configured the API is a no-op, so this costs a context-variable
read; the server configures the SDK from the standard ``OTEL_*`` variables
(``gateway.observe.tracing``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, ParamSpec, TypeVar

from opentelemetry import trace

TRACER = trace.get_tracer("cleveragents.acp")


def current_trace_id() -> str:
    """The trace id of the call this code runs for (32 hex digits), or "" outside any trace."""
    span_context = trace.get_current_span().get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else ""


P = ParamSpec("P")
R = TypeVar("R")


def traced(
    name: str, attributes: Callable[..., Mapping[str, str]] | None = None
) -> Callable[[Callable[P, Coroutine[Any, Any, R]]], Callable[P, Coroutine[Any, Any, R]]]:
    """Run a coroutine function in a child span of the current trace (``attributes`` from its
    arguments). A no-op span without a configured SDK."""

    def decorate(function: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]:
        @functools.wraps(function)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with TRACER.start_as_current_span(
                name, attributes=dict(attributes(*args, **kwargs)) if attributes is not None else None
            ):
                return await function(*args, **kwargs)

        return run

    return decorate
