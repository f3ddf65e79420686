"""Logs that never hold up the event loop: every record goes through a queue to one writer
thread. The access log is one line per ACP call and one per stream opened and closed:
JSON when stdout is not a terminal (or ``--log-format json``), readable text on a terminal.

Access lines carry only bounded fields the server chose (never a token, ticket, API key or
header): time, request id, trace id, operation, transport, principal, namespace, ACP code and
duration.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import queue
import sys
import threading
import time
from typing import IO, Any

import orjson

ACCESS_LOGGER = "cleveragents.acp.access"
FORMATS = ("auto", "json", "text")
_ACCESS_FIELDS = (
    "request_id",
    "trace_id",
    "operation",
    "transport",
    "principal",
    "namespace",
    "code",
    "duration_ms",
    "event",
    "reason",
)


def _iso(created: float) -> str:
    seconds = int(created)
    return (
        time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int((created - seconds) * 1000):03d}Z"
    )


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {"time": _iso(record.created), "level": record.levelname.lower()}
        access = getattr(record, "acp", None)
        if isinstance(access, dict):
            line.update(access)
        else:
            line["logger"] = record.name
            line["message"] = record.getMessage()
            if record.exc_info:
                line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        access = getattr(record, "acp", None)
        if not isinstance(access, dict):
            return f"{_iso(record.created)} {record.levelname:<7} {record.name}: {super().format(record)}"
        parts = [
            _iso(record.created),
            f"{access.get('operation', '-'):<18}",
            f"{access.get('transport', '-'):<8}",
        ]
        parts.append(f"{access.get('code', '-'):<16}")
        if "duration_ms" in access:
            parts.append(f"{access['duration_ms']:>9.3f} ms")
        for key in ("event", "reason", "principal", "namespace", "request_id", "trace_id"):
            if access.get(key):
                parts.append(f"{key}={access[key]}")
        return " ".join(parts)


def access(fields: dict[str, Any]) -> None:
    """Queue one access line (the caller checks ``ACCESS.isEnabledFor(INFO)`` first)."""
    ACCESS.handle(ACCESS.makeRecord(ACCESS_LOGGER, logging.INFO, "", 0, "", (), None, extra={"acp": fields}))


ACCESS = logging.getLogger(ACCESS_LOGGER)


# Records waiting for the writer; past this (a stalled stdout) new ones are dropped, counted.
MAX_QUEUED = 10_000
STOP_SECONDS = 2.0


class _QueueHandler(logging.handlers.QueueHandler):
    """Access records go to the queue as they are: their fields need no formatting on the
    caller's thread (the event loop), only in the writer thread. A full queue drops the
    record rather than wait: a reader that stopped reading the log never stalls a call."""

    dropped = 0

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        if "acp" in record.__dict__:
            return record
        prepared: logging.LogRecord = super().prepare(record)
        return prepared


class Logging:
    """The server's logging set-up: root and access loggers into one queue, one writer thread."""

    def __init__(
        self,
        *,
        level: str = "warning",
        fmt: str = "auto",
        access_log: bool = True,
        stream: IO[str] | None = None,
        owns_stream: bool = False,
    ) -> None:
        """``owns_stream``: close ``stream`` when stopped (a file opened for this server)."""
        if fmt not in FORMATS:
            raise ValueError(f"log format is one of {', '.join(FORMATS)}")
        self.stream = stream or sys.stdout
        self._owns_stream = owns_stream
        if fmt == "auto":
            fmt = "text" if self.stream.isatty() else "json"
        self.format = fmt
        self.level = level.upper()
        self.access_log = access_log
        self._queue: queue.Queue[logging.LogRecord | None] = queue.Queue(MAX_QUEUED)
        self._writer = logging.StreamHandler(self.stream)
        self._writer.setFormatter(JSONFormatter() if fmt == "json" else TextFormatter("%(message)s"))
        self._handler = _QueueHandler(self._queue)
        self._thread: threading.Thread | None = None
        self._saved: list[tuple[logging.Logger, list[logging.Handler], int, bool]] = []

    def _write(self) -> None:
        while (record := self._queue.get()) is not None:
            self._writer.handle(record)

    def start(self) -> None:
        root = logging.getLogger()
        self._saved = [
            (logger, list(logger.handlers), logger.level, logger.propagate) for logger in (root, ACCESS)
        ]
        root.handlers = [self._handler]
        root.setLevel(self.level)
        ACCESS.handlers = [self._handler]
        ACCESS.propagate = False
        ACCESS.setLevel(logging.INFO if self.access_log else logging.CRITICAL + 1)
        self._thread = threading.Thread(target=self._write, name="acp-log-writer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Write what is queued, then give the loggers back their handlers (once)."""
        if not self._saved:
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=STOP_SECONDS)
        if self._thread is not None:
            # A writer stuck on a stdout nobody reads is left behind (a daemon), not waited for.
            self._thread.join(STOP_SECONDS)
            stuck = self._thread.is_alive()
            self._thread = None
            if self._owns_stream and not stuck:
                self.stream.close()
        for logger, handlers, level, propagate in self._saved:
            logger.handlers = handlers
            logger.setLevel(level)
            logger.propagate = propagate
        self._saved = []
