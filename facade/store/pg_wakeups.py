"""The PostgreSQL store's event wake-ups: LISTEN on the channel its appends notify."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import psycopg
from psycopg import sql

from cleveragents.acp.facade.store.base import EventWakeups
from cleveragents.acp.facade.store.pg_settings import CONNECT_TIMEOUT
from cleveragents.acp.facade.store.pg_urls import redacted

log = logging.getLogger(__name__)


class PostgresWakeups(EventWakeups):
    """LISTEN on a connection of its own, used by the follower's thread alone. A hint, never
    the truth: a notification lost with a dropped connection is covered by the follower's
    poll, and the connection is made again at the next wait."""

    # How long one look at the connection blocks, so a close is noticed soon.
    SLICE = 0.2

    def __init__(self, url: str, channel: str, conninfo: str | None = None) -> None:
        super().__init__()
        self._url = url
        self._conninfo = url if conninfo is None else conninfo
        self._channel = channel
        self._conn: psycopg.Connection[Any] | None = None
        # Held while the connection is in use: close() releases it only between waits.
        self._using = threading.Lock()

    def _listening(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self._conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT)
            self._conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(self._channel)))
        return self._conn

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._using:
            while not self._closed.is_set():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                try:
                    conn = self._listening()
                    for _ in conn.notifies(timeout=min(self.SLICE, remaining), stop_after=1):
                        return True
                except psycopg.Error as exc:
                    log.warning(
                        "event wake-ups from %s lost (%s); polling until back", redacted(self._url), exc
                    )
                    self._drop()
                    self._closed.wait(min(remaining, 1.0))
            self._drop()
        return False

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.closed:
            conn.close()

    def close(self) -> None:
        super().close()
        # A wait in progress sees the flag within SLICE and drops the connection itself.
        if self._using.acquire(timeout=self.SLICE * 10):
            try:
                self._drop()
            finally:
                self._using.release()
