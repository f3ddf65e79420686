"""What a caller writes or sizes, run so that it cannot hold the service: regexes on RE2 in
linear time (``patterns``), path globs (``globs``), JSON Schemas (``json_schemas``), work the
caller shapes on a pool shared fairly between namespaces (``caller_work``), and long work in
slices that give the event loop back (``slices``)."""
