"""OpenTelemetry for the server: the SDK switched on by the standard ``OTEL_*`` variables, and
W3C ``traceparent`` taken from HTTP headers and gRPC metadata.

The product depends on the API only; ``pip install 'cleveragents-acp[otel]'`` adds the SDK
and the OTLP exporter. Tracing is on when ``OTEL_TRACES_EXPORTER`` names an exporter, or an
``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`` is set, and ``OTEL_SDK_DISABLED`` is not ``true``.
When it is off, a caller's ``traceparent`` is still continued (its trace id reaches the
access log and the events of the call) without making spans.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger(__name__)

PROPAGATOR = TraceContextTextMapPropagator()
TRACEPARENT = "traceparent"
# version 00: "00-" 32 hex "-" 16 hex "-" 2 hex; later versions may append fields.
_TRACEPARENT_MIN = 55
_TRACEPARENT_MAX = 512
_HEX = frozenset("0123456789abcdef")


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    return bool(
        environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    )


def configure(environ: Mapping[str, str] = os.environ) -> bool:
    """Install the SDK's tracer provider with the exporter ``OTEL_TRACES_EXPORTER`` names
    (otlp by default, console too) when the environment asks; True when tracing is on."""
    if not wanted(environ):
        return False
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
    except ImportError:
        log.warning(
            "OTEL_* asks for traces but the SDK is not installed: pip install 'cleveragents-acp[otel]'"
        )
        return False
    exporter: SpanExporter
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "console":
        exporter = ConsoleSpanExporter()
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning(
                "OTEL_* asks for OTLP traces but the exporter is not installed: "
                "pip install 'cleveragents-acp[otel]'"
            )
            return False
        exporter = OTLPSpanExporter()
    service = environ.get("OTEL_SERVICE_NAME") or "cleveragents-acp"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True


def enabled() -> bool:
    """Whether a real tracer provider is installed (ours, or one a test or embedder set)."""
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def remote_context(traceparent: str | None) -> otel_context.Context | None:
    """The context a caller's ``traceparent`` continues, or None when there is none or it is
    malformed (a malformed one is ignored, as W3C Trace Context says, never an error)."""
    if not traceparent or not _TRACEPARENT_MIN <= len(traceparent) <= _TRACEPARENT_MAX:
        return None
    version, trace_id, span_id, flags = (
        traceparent[:2],
        traceparent[3:35],
        traceparent[36:52],
        traceparent[53:55],
    )
    if (
        version == "ff"
        or traceparent[2] != "-"
        or traceparent[35] != "-"
        or traceparent[52] != "-"
        or not _HEX.issuperset(version + trace_id + span_id + flags)
        or (version == "00" and len(traceparent) != _TRACEPARENT_MIN)
    ):
        return None
    parsed = SpanContext(
        int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16))
    )
    if not parsed.is_valid:
        return None
    return trace.set_span_in_context(NonRecordingSpan(parsed))


def inject() -> dict[str, str]:
    """The ``traceparent`` (and ``tracestate``) of the current span, for an upstream call."""
    carrier: dict[str, str] = {}
    if trace.get_current_span().get_span_context().is_valid:
        PROPAGATOR.inject(carrier)
    return carrier
