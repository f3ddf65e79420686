"""The PostgreSQL store under load (only when a PostgreSQL is reachable: ``$ACP_BENCH_POSTGRES``,
default the local one every development machine runs; otherwise the family says so and
records nothing).

- ``pg_gateway_envelope_ratio``: ``session.show`` req/s through ``POST /api/v1/acp`` at 16
  connections, the server on PostgreSQL / the same server on SQLite, measured in turn in
  the same run.
- ``pg_write_read_ratio``: ``session.create`` req/s / ``session.show`` req/s, both through
  the envelope at 16 connections, on PostgreSQL.

Each runs in a schema of its own, dropped after.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import sys
import urllib.parse
from collections.abc import Iterator

import orjson
import psycopg
from psycopg import sql

from bench.product import Product
from bench.run import Run
from bench.unary import _check_gateway, _http, best_of, seed_session

URL = os.environ.get("ACP_BENCH_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test")


def reachable() -> str | None:
    """Why PostgreSQL cannot be measured here, or None."""
    try:
        with psycopg.connect(URL, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


@contextlib.contextmanager
def schema() -> Iterator[str]:
    """A URL selecting a new schema, dropped after."""
    name = f"acp_bench_{secrets.token_hex(6)}"
    parts = urllib.parse.urlsplit(URL)
    query = [*urllib.parse.parse_qsl(parts.query), ("options", f"-csearch_path={name}")]
    try:
        yield urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
    finally:
        with psycopg.connect(URL, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))


def run_all(run: Run) -> None:
    reason = reachable()
    if reason is not None:
        print(f"bench: postgres skipped: no PostgreSQL at {URL} ({reason})", file=sys.stderr, flush=True)
        run.note("postgres_skipped", reason)
        return
    folder = run.scratch("postgres")
    with schema() as url, Product(folder / "sqlite") as lite, Product(folder / "pg", db=url) as pg:
        show = {}
        for name, product in (("sqlite", lite), ("pg", pg)):
            session_id, _ = asyncio.run(seed_session(product))
            body = orjson.dumps({"operation": "session.show", "params": {"session_id": session_id}})
            _check_gateway(product, session_id, body)
            show[name] = (
                product.server,
                _http(run, f"{product.http_url}/api/v1/acp", "POST", body, product.auth_header),
            )
        create = orjson.dumps({"operation": "session.create", "params": {"title": "bench"}})
        best = best_of(
            run,
            {
                **show,
                "pg_create": (
                    pg.server,
                    _http(run, f"{pg.http_url}/api/v1/acp", "POST", create, pg.auth_header),
                ),
            },
        )
    (lite_show, lite_cpu), (pg_show, pg_cpu), (pg_create, create_cpu) = (
        best["sqlite"],
        best["pg"],
        best["pg_create"],
    )
    by = pg_show.generator
    run.note("pg_envelope_show_rps", pg_show.rps)
    run.note("pg_envelope_show_cpu_us", pg_cpu)
    run.note("pg_envelope_show_p99_ms", pg_show.p99_ms)
    run.note("sqlite_envelope_show_rps", lite_show.rps)
    run.note("sqlite_envelope_show_cpu_us", lite_cpu)
    run.note("pg_envelope_create_rps", pg_create.rps)
    run.note("pg_envelope_create_cpu_us", create_cpu)
    run.note("pg_envelope_create_p99_ms", pg_create.p99_ms)
    run.record("pg_gateway_envelope_ratio", pg_show.rps / lite_show.rps, by)
    run.record("pg_write_read_ratio", pg_create.rps / pg_show.rps, by)
