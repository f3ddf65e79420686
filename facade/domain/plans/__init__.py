"""The plan engine: Strategize -> Execute -> Apply over a project's directory resources."""
