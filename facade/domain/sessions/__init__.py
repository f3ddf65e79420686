"""Sessions (``session.*``): the service, how sessions and messages sit in the store, and the
export document."""
