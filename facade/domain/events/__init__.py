"""Events (``events.*``): the event log with its subscriptions, and the stream tickets a browser
opens an event stream with."""
