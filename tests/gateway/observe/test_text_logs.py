"""Issue 31, finding 10: the text log wrote caller text raw, so a newline forged a line of
its own and an ANSI escape or a bidirectional override rewrote what an operator read."""

from __future__ import annotations

import io
import logging

from cleveragents.acp.gateway.observe import logs as logs_module
from cleveragents.acp.gateway.observe.logs import Logging

FORGED = "abc\n2026-12-07T00:00:00.000Z session.delete  grpc     OK   principal=admin\x1b[2K\u202etxt.exe"


def lines_of(fmt: str, write: object) -> list[str]:
    stream = io.StringIO()
    logs = Logging(fmt=fmt, stream=stream)
    logs.start()
    try:
        assert callable(write)
        write(logs)
    finally:
        logs.stop()
    return stream.getvalue().splitlines()


def test_caller_text_in_a_text_access_line_is_escaped() -> None:
    def write(logs: Logging) -> None:
        logs.call((FORGED, "-", "session.show", "envelope", "alice", FORGED, "NOT_FOUND", 0.001))
        logs.access({"event": "stream_opened", "operation": FORGED, "namespace": FORGED, "reason": FORGED})

    lines = lines_of("text", write)
    assert len(lines) == 2, lines
    for line in lines:
        for raw in ("\n", "\x1b", "\u202e"):
            assert raw not in line, line
        for escaped in ("\\x0a2026-12-07T00:00:00.000Z", "\\x1b[2K", "\\u202e"):
            assert escaped in line, line


def test_caller_text_in_a_log_message_cannot_start_a_line() -> None:
    def write(_logs: Logging) -> None:
        logging.getLogger("cleveragents.acp.test").warning("refused %s", FORGED)

    lines = lines_of("text", write)
    assert len(lines) == 2, lines
    assert lines[1].startswith("    2026-12-07"), lines
    assert "\x1b" not in "".join(lines)
    assert "\u202e" not in "".join(lines)


def test_json_lines_stay_one_line_each() -> None:
    def write(logs: Logging) -> None:
        logs.call((FORGED, "-", "session.show", "envelope", "alice", FORGED, "NOT_FOUND", 0.001))

    lines = lines_of("json", write)
    assert len(lines) == 1, lines


def test_escape_leaves_ordinary_text_alone() -> None:
    escape = logs_module.escape
    assert escape("plan.status ünïcode 名前 -_.:/") == "plan.status ünïcode 名前 -_.:/"
    assert escape("\t\r\x7f\x85\u2028\u2066") == "\\x09\\x0d\\x7f\\x85\\u2028\\u2066"
