"""The ``agents`` command line: one small module per group of subcommands."""
