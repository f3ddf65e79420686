"""Observability of a server: Prometheus metrics, OpenTelemetry traces, access logs,
readiness. Attached to the facade's ``CallObserver`` seam and to the HTTP and gRPC servers."""
