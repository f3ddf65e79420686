"""Logs that never hold up the event loop: every record goes through one queue to one writer
thread, which formats and writes them in batches. The access log is one line per ACP call and
one per stream opened and closed: JSON when stdout is not a terminal (or ``--log-format
json``), readable text on a terminal.

Access lines carry only bounded fields the server chose (never a token, ticket, API key or
header): time, request id, trace id, operation, transport, principal, namespace, ACP code and
duration. They skip ``logging.LogRecord`` (a tenth of a call's cost): the caller queues a
dict, the writer formats it.
"""

from __future__ import annotations

import logging
import logging.handlers
import queue
import sys
import threading
import time
from typing import IO, Any

import orjson

from cleveragents.acp.gateway.http import redaction

ACCESS_LOGGER = "cleveragents.acp.access"
FORMATS = ("auto", "json", "text")
# Records waiting for the writer; past this (a stdout nobody reads) new ones are dropped.
MAX_QUEUED = 10_000
# Lines written with one write and one flush.
BATCH = 512
STOP_SECONDS = 2.0
# How long the writer lets lines gather after the first before writing them.
GATHER_SECONDS = 0.05

# The fields of a call's access line, in order; a call queues their values alone (the
# writer thread makes the line's dict), with the duration in seconds.
CALL_FIELDS = ("request_id", "trace_id", "operation", "transport", "principal", "namespace", "code")
Call = tuple[str, str, str, str, str, str, str, float]
Access = tuple[float, dict[str, Any] | Call]

# The text of the last second seen (lines come in bursts within one second).
_second: tuple[int, str] = (-1, "")
# A time's milliseconds and zone, by millisecond (formatted once, not per line).
_MILLIS = tuple(f".{millis:03d}Z" for millis in range(1000))


def _iso(created: float) -> str:
    global _second
    seconds = int(created)
    last, text = _second
    if last != seconds:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        _second = (seconds, text)
    return text + _MILLIS[min(int((created - seconds) * 1000), 999)]


def _call_fields(values: Call) -> dict[str, Any]:
    fields: dict[str, Any] = dict(zip(CALL_FIELDS, values, strict=False))
    fields["duration_ms"] = round(values[-1] * 1000, 3)
    return fields


def _json_access(created: float, fields: dict[str, Any]) -> str:
    return orjson.dumps({"time": _iso(created), "level": "info", **fields}).decode()


def _json_call(created: float, values: Call) -> str:
    """``_json_access`` of ``_call_fields``, made in one dict: the writer thread takes the
    GIL for every call's line, so its cost is the event loop's too."""
    request_id, trace_id, operation, transport, principal, namespace, code, seconds = values
    return orjson.dumps(
        {
            "time": _iso(created),
            "level": "info",
            "request_id": request_id,
            "trace_id": trace_id,
            "operation": operation,
            "transport": transport,
            "principal": principal,
            "namespace": namespace,
            "code": code,
            "duration_ms": round(seconds * 1000, 3),
        }
    ).decode()


def _escapes() -> dict[int, str]:
    """Characters a terminal or a log reader would act on: C0 and C1 controls (newlines forge
    lines, ESC starts ANSI sequences), DEL, the line and paragraph separators and the
    bidirectional overrides and isolates (U+202E turns text around)."""
    points = [
        *range(0x20),
        *range(0x7F, 0xA0),
        0x2028,
        0x2029,
        *range(0x202A, 0x202F),
        *range(0x2066, 0x206A),
    ]
    return {point: f"\\x{point:02x}" if point < 0x100 else f"\\u{point:04x}" for point in points}


_ESCAPES = _escapes()
# A message's own line breaks (a traceback's) stay, each continuation indented, so no text
# in it can start a line of its own.
_MESSAGE_ESCAPES = {**_ESCAPES, ord("\n"): "\n    "}


def escape(value: object) -> str:
    """A field of a text line as it reads, never as a terminal would act on it."""
    return str(value).translate(_ESCAPES)


def _text_call(created: float, values: Call) -> str:
    return _text_access(created, _call_fields(values))


def _text_access(created: float, fields: dict[str, Any]) -> str:
    parts = [
        _iso(created),
        f"{escape(fields.get('operation', '-')):<18}",
        f"{escape(fields.get('transport', '-')):<8}",
        f"{escape(fields.get('code', '-')):<16}",
    ]
    if "duration_ms" in fields:
        parts.append(f"{fields['duration_ms']:>9.3f} ms")
    for key in ("event", "reason", "principal", "namespace", "request_id", "trace_id"):
        if fields.get(key):
            parts.append(f"{key}={escape(fields[key])}")
    return " ".join(parts)


class JSONFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": _iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        return orjson.dumps(line).decode()


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage().translate(_MESSAGE_ESCAPES)
        return f"{_iso(record.created)} {record.levelname:<7} {record.name}: {message}"


class _Sink:
    """Where the server's log lines go: the queue the writer thread empties."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[Access | logging.LogRecord | None] = queue.SimpleQueue()
        self.enabled = False
        self.dropped = 0

    def put(self, item: Access | logging.LogRecord) -> None:
        if self.queue.qsize() >= MAX_QUEUED:
            self.dropped += 1
            return
        self.queue.put(item)


class _QueueHandler(logging.Handler):
    """Other records: formatted (message and exception text) here, written by the writer."""

    def __init__(self, sink: _Sink) -> None:
        super().__init__()
        self._sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            # A library logging a URL (httpx: "HTTP Request: GET ...?ticket=...") never shows a
            # stream ticket either.
            record.msg = redaction.redact(message)
            record.args = None
            record.exc_info = None
            self._sink.put(record)
        except Exception:
            self.handleError(record)


class Logging:
    """The server's logging set-up: root logger and access lines into one queue, one writer."""

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
        self._formatter: logging.Formatter = JSONFormatter() if fmt == "json" else TextFormatter()
        self._access_line = _json_access if fmt == "json" else _text_access
        self._call_line = _json_call if fmt == "json" else _text_call
        self._sink = _Sink()
        self._handler = _QueueHandler(self._sink)
        self._thread: threading.Thread | None = None
        self._saved: list[tuple[logging.Handler, ...] | int] = []

    @property
    def access_on(self) -> bool:
        return self._sink.enabled

    def access(self, fields: dict[str, Any]) -> None:
        """Queue one access line (callers check ``access_on`` first)."""
        self._sink.put((time.time(), fields))

    def call(self, values: Call) -> None:
        """Queue a call's access line: the values of ``CALL_FIELDS`` and its duration in
        seconds (callers check ``access_on`` first)."""
        self._sink.put((time.time(), values))

    @property
    def dropped(self) -> int:
        return self._sink.dropped

    def _line(self, item: Access | logging.LogRecord) -> str:
        if isinstance(item, logging.LogRecord):
            return self._formatter.format(item)
        created, fields = item
        if type(fields) is tuple:
            return self._call_line(created, fields)
        return self._access_line(created, fields)  # type: ignore[arg-type]

    def _write(self) -> None:
        """Wake on the first queued line, then let the lines of the next ``GATHER_SECONDS``
        gather before writing them: under load the writer takes the GIL a few times a
        second, not once per call (waking per line halved the server's throughput)."""
        pending = self._sink.queue
        while True:
            items = [pending.get()]
            if items[0] is not None:
                time.sleep(GATHER_SECONDS)
                # Bounded: the sink holds at most MAX_QUEUED.
                while items[-1] is not None:
                    try:
                        items.append(pending.get_nowait())
                    except queue.Empty:
                        break
            stop = items[-1] is None
            if stop:
                items.pop()
            for start in range(0, len(items), BATCH):
                self._emit([self._line(item) for item in items[start : start + BATCH] if item is not None])
            if stop:
                return

    def _emit(self, lines: list[str]) -> None:
        try:
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def start(self) -> None:
        root = logging.getLogger()
        self._saved = [tuple(root.handlers), root.level]
        root.handlers = [self._handler]
        root.setLevel(self.level)
        self._sink.enabled = self.access_log
        self._thread = threading.Thread(target=self._write, name="acp-log-writer", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Write what is queued, then give the root logger back its handlers (once)."""
        if not self._saved:
            return
        self._sink.enabled = False
        root = logging.getLogger()
        handlers, level = self._saved
        assert isinstance(handlers, tuple)
        assert isinstance(level, int)
        root.handlers = list(handlers)
        root.setLevel(level)
        self._saved = []
        self._sink.queue.put(None)
        if self._thread is not None:
            # A writer stuck on a stdout nobody reads is left behind (a daemon), not waited for.
            self._thread.join(STOP_SECONDS)
            stuck = self._thread.is_alive()
            self._thread = None
            if self._owns_stream and not stuck:
                self.stream.close()
