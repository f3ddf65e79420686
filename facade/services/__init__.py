"""The facade's servicers: each subclasses a generated servicer and delegates to the domain."""
