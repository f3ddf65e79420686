"""Canonical JSON of a recorded run, so runs on different transports compare equal.

What necessarily differs between two runs is normalized, consistently across the whole
run: each distinct ULID becomes ``<id1>``, ``<id2>``... in order of first appearance
(dict keys walked in sorted order), each distinct page token or stream ticket ``<token1>``...,
each distinct RFC 3339 time ``<time1>``... (so which values are the same instant must match
across transports, and a transport that loses a time, or answers the epoch for all, differs),
durations ``<duration>``, booleans ``<true>``/``<false>`` (``True == 1`` in Python), and each
backend's scratch folder ``<root>``. A time outside the
run's day is an error at once. Everything else, event sequences included, must match exactly.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Iterable
from typing import Any

ULID = re.compile(r"\b[0-7][0-9A-HJKMNP-TV-Z]{25}\b")
TIME = re.compile(r"\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})")
# Page tokens, stream tickets and webhook secrets (random, secret: every run issues others).
TOKEN_KEYS = frozenset({"next_page_token", "page_token", "ticket", "secret"})
DURATION_KEYS = frozenset({"duration_ms", "latency_ms"})
PLAUSIBLE = datetime.timedelta(days=1)


class Canonicalizer:
    def __init__(self, roots: Iterable[str] = ()) -> None:
        # Longest first, so a folder inside another root is replaced whole.
        self.roots = sorted((r for r in roots if r), key=len, reverse=True)
        self.ids: dict[str, str] = {}
        self.tokens: dict[str, str] = {}
        self.times: dict[datetime.datetime, str] = {}

    def _time(self, match: re.Match[str]) -> str:
        """The same instant gets the same label however it is written (``Z``, an offset,
        more or fewer fraction digits)."""
        instant = datetime.datetime.fromisoformat(match.group(0).replace("Z", "+00:00"))
        now = datetime.datetime.now(datetime.UTC)
        if abs(now - instant) > PLAUSIBLE:
            raise AssertionError(f"time {match.group(0)} is not of this run (now {now.isoformat()})")
        if instant not in self.times:
            self.times[instant] = f"<time{len(self.times) + 1}>"
        return self.times[instant]

    def _id(self, match: re.Match[str]) -> str:
        value = match.group(0)
        if value not in self.ids:
            self.ids[value] = f"<id{len(self.ids) + 1}>"
        return self.ids[value]

    def text(self, value: str) -> str:
        for root in self.roots:
            value = value.replace(root, "<root>")
        value = TIME.sub(self._time, value)
        return ULID.sub(self._id, value)

    def token(self, value: str) -> str:
        if not value:
            return value
        if value not in self.tokens:
            self.tokens[value] = f"<token{len(self.tokens) + 1}>"
        return self.tokens[value]

    def __call__(self, value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: self(value[k], str(k)) for k in sorted(value, key=str)}
        if isinstance(value, list | tuple):
            return [self(item, key) for item in value]
        if isinstance(value, bool):
            # Python's True == 1: a transport answering 1 for true must not compare equal.
            return "<true>" if value else "<false>"
        if key in DURATION_KEYS and isinstance(value, int | float):
            return "<duration>"
        if isinstance(value, str):
            return self.token(value) if key in TOKEN_KEYS else self.text(value)
        if isinstance(value, float) and value.is_integer():
            # Error details cross gRPC as a Struct, whose numbers are all doubles.
            return int(value)
        return value
