"""gRPC server: generic handlers over the catalog."""
