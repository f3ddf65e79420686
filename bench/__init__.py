"""Benchmarks: every transport measured against its raw baseline in the same run.

``python -m bench`` (``make bench``) writes ``bench/results.json`` and prints a table;
``docs/benchmarks.md`` explains each figure.
"""
