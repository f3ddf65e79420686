"""A real PostgreSQL for the tests that need one: a fresh schema per test, dropped after.

The server is the one every development machine and CI runs on 127.0.0.1:5432 (trust
auth), or the one ``$ACP_TEST_POSTGRES`` names (a libpq URL). When none is reachable the
PostgreSQL tests skip and the run says so in one loud header line; under ``CI=true`` they
fail instead of skipping.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import urllib.parse
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests import needs

URL = os.environ.get("ACP_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")
SKIPPED = "PostgreSQL not reachable"
HOW = (
    "start it with `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start`, "
    "or point $ACP_TEST_POSTGRES at one"
)


@functools.cache
def missing() -> str | None:
    """Why the PostgreSQL tests cannot run here, or None when they can."""
    try:
        with psycopg.connect(URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"no PostgreSQL at {URL} ({reason}); {HOW}"
    return None


def header() -> str | None:
    reason = missing()
    if reason is None:
        return f"postgres: tests use {URL}, one schema per test"
    return needs.loud("POSTGRESQL TESTS", reason)


def pytest_report_header(config: pytest.Config) -> str | None:
    return header()


def need() -> None:
    """Skip (fail under CI=true) the calling test when no PostgreSQL is reachable."""
    reason = missing()
    if reason is not None:
        needs.unavailable(f"{SKIPPED}: {reason}")


def with_schema(url: str, schema: str) -> str:
    """``url`` with its search path set to ``schema`` (the way a user selects one)."""
    parts = urllib.parse.urlsplit(url)
    query = [(k, v) for k, v in urllib.parse.parse_qsl(parts.query) if k != "options"]
    query.append(("options", f"-csearch_path={schema}"))
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))


def admin() -> psycopg.Connection[tuple[Any, ...]]:
    return psycopg.connect(URL, autocommit=True, connect_timeout=10)


def drop_schema(schema: str) -> None:
    with admin() as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


@contextlib.contextmanager
def fresh_schema(prefix: str = "t") -> Iterator[str]:
    """The URL of a new, empty schema (created by the store on first open), dropped after."""
    need()
    schema = f"acp_{prefix}_{secrets.token_hex(6)}"
    try:
        yield with_schema(URL, schema)
    finally:
        drop_schema(schema)


@pytest.fixture
def pg_url() -> Iterator[str]:
    with fresh_schema() as url:
        yield url
