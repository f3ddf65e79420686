"""JSON/HTTP gateway: envelope, REST routes, SSE, OpenAPI."""
