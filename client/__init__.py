"""Presentation: ``ACPClient`` with its local, HTTP and gRPC transports, and the ``agents`` CLI."""
