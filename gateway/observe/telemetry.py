"""``CallTelemetry``: the server's ``CallObserver``. Per call it counts the answer, times it,
continues the caller's trace (a span when tracing is on) and writes one access line."""

from __future__ import annotations

import time
from typing import Any

from google.protobuf import message
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.facade import observer as observing
from cleveragents.acp.facade.observer import OK
from cleveragents.acp.gateway.observe import tracing
from cleveragents.acp.gateway.observe.logs import Logging
from cleveragents.acp.gateway.observe.metrics import Metrics

TRACER = trace.get_tracer("cleveragents.acp.server")


_HAS_NAMESPACE: dict[str, bool] = {}


def _namespace(op: Operation, request: message.Message) -> str:
    """The request's ``namespace`` field, if its type has one (looked up once per operation:
    a missing attribute on a message costs an exception)."""
    has = _HAS_NAMESPACE.get(op.name)
    if has is None:
        field = op.request_type.DESCRIPTOR.fields_by_name.get("namespace")
        has = _HAS_NAMESPACE[op.name] = field is not None and field.type == field.TYPE_STRING
    return str(getattr(request, "namespace", "")) if has else ""


def _trace_id(span_context: trace.SpanContext) -> str:
    return format(span_context.trace_id, "032x") if span_context.is_valid else ""


class _Call:
    __slots__ = ("_ctx", "_namespace", "_op", "_span", "_started", "_telemetry", "_token")

    def __init__(
        self,
        telemetry: CallTelemetry,
        op: Operation,
        ctx: CallContext,
        namespace: str,
        span: Span | None,
        token: object | None,
    ) -> None:
        self._telemetry = telemetry
        self._op = op
        self._ctx = ctx
        self._namespace = namespace
        self._span = span
        self._token = token
        self._started = time.perf_counter()

    def finish(self, code: str) -> None:
        seconds = time.perf_counter() - self._started
        telemetry, op, ctx, span = self._telemetry, self._op, self._ctx, self._span
        telemetry.metrics.count(op.name, ctx.transport, code, seconds)
        trace_id = ""
        if span is not None:
            trace_id = _trace_id(span.get_span_context())
            if span.is_recording():
                span.set_attribute("acp.code", code)
                if ctx.principal is not None:
                    span.set_attribute("acp.principal", ctx.principal.name)
                if code != OK:
                    span.set_status(Status(StatusCode.ERROR, code))
                span.end()
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
        log = telemetry.log
        if log is not None and log.access_on:
            principal = ctx.principal
            log.call(
                (
                    ctx.request_id,
                    trace_id,
                    op.name,
                    ctx.transport,
                    principal.name if principal is not None else "",
                    self._namespace,
                    code,
                    seconds,
                )
            )


class _Stream:
    __slots__ = ("_fields", "_telemetry", "_transport")

    def __init__(self, telemetry: CallTelemetry, op: Operation, ctx: CallContext) -> None:
        self._telemetry = telemetry
        self._transport = ctx.transport
        telemetry.metrics.subscribers.labels(ctx.transport).inc()
        self._fields: dict[str, Any] = {
            "request_id": ctx.request_id,
            "operation": op.name,
            "transport": ctx.transport,
            "principal": ctx.principal.name if ctx.principal is not None else "",
        }
        self._log("opened", "")

    def _log(self, event: str, reason: str) -> None:
        log = self._telemetry.log
        if log is not None and log.access_on:
            log.access({**self._fields, "event": f"stream {event}", "reason": reason})

    def ended(self, reason: str) -> None:
        if reason == observing.STREAM_CLOSED and self._telemetry.draining:
            reason = observing.STREAM_SHUTDOWN
        metrics = self._telemetry.metrics
        metrics.subscribers.labels(self._transport).dec()
        metrics.subscribers_ended.labels(reason).inc()
        self._log("closed", reason)


class CallTelemetry:
    def __init__(
        self,
        metrics: Metrics | None = None,
        *,
        tracer: trace.Tracer | None = None,
        log: Logging | None = None,
    ) -> None:
        """Spans come from ``tracer``, else from the global provider if one is installed now
        (``tracing.configure`` runs before a server builds this); none otherwise."""
        self.metrics = metrics or Metrics()
        self.log = log
        self._tracer = tracer or (TRACER if tracing.enabled() else None)
        # Set when the server drains: streams it ends then end for "shutdown".
        self.draining = False

    def start(self, op: Operation, request: message.Message, ctx: CallContext) -> _Call:
        namespace = _namespace(op, request)
        tracer = self._tracer
        if tracer is None and not ctx.traceparent:
            # Tracing off and no trace to continue: nothing to make or attach.
            return _Call(self, op, ctx, namespace, None, None)
        parent = tracing.remote_context(ctx.traceparent)
        span: Span | None = None
        token: object | None = None
        if tracer is not None:
            span = tracer.start_span(
                op.name,
                context=parent,
                kind=SpanKind.SERVER,
                attributes={
                    "acp.operation": op.name,
                    "acp.request_id": ctx.request_id,
                    "acp.namespace": namespace,
                    "acp.transport": ctx.transport,
                },
            )
            token = otel_context.attach(trace.set_span_in_context(span, parent))
        elif parent is not None:
            # No spans of our own, but the caller's trace id still reaches logs and events.
            span = trace.get_current_span(parent)
            token = otel_context.attach(parent)
        return _Call(self, op, ctx, namespace, span, token)

    def stream_opened(self, op: Operation, ctx: CallContext) -> _Stream:
        return _Stream(self, op, ctx)
