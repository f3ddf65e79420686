"""The times an answer carries are real ones: the canonical traces compare only which
instants are equal, so a transport that shifts every time by the same amount would pass
them. Here each time is checked against the wall clock around the call that answered it.

Every time is at or after the backend was opened (all it holds was made since) and at or
before the answer arrived; an ``expire_time`` lies ahead, at most a ticket's longest life
past the answer. Within one entity, creation comes before update and a phase starts
before it ends.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from cleveragents.acp.facade.domain.events.tickets import MAX_TTL_SECONDS
from tests.conformance.canonical import TIME

# Fields whose time lies ahead of the answer, with how far at most.
AHEAD = {
    "expire_time": datetime.timedelta(seconds=MAX_TTL_SECONDS),
    # A rotated-out webhook secret signs on for the overlap, at most 7 days.
    "previous_secret_expire_time": datetime.timedelta(days=7),
}
# Times cross the wire as floats and back: a microsecond either way is rounding, not a shift.
ROUNDING = datetime.timedelta(milliseconds=1)
# Pairs that must be in order within one object (earlier, later).
ORDERED = (("create_time", "update_time"), ("start_time", "end_time"))


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def instant(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


@dataclass(frozen=True)
class Window:
    """The wall-clock span one answer's times must fall in."""

    # When the backend was opened: nothing it holds is older.
    opened: datetime.datetime
    # When the call was made and when its answer arrived.
    sent: datetime.datetime
    answered: datetime.datetime

    def check(self, value: Any, key: str = "") -> None:
        """Raise AssertionError naming the first time out of the window or out of order."""
        if isinstance(value, dict):
            for k, v in value.items():
                self.check(v, str(k))
            for earlier, later in ORDERED:
                first, second = value.get(earlier), value.get(later)
                if isinstance(first, str) and isinstance(second, str) and first and second:
                    assert instant(first) <= instant(second), f"{earlier} {first} after {later} {second}"
        elif isinstance(value, list | tuple):
            for item in value:
                self.check(item, key)
        elif isinstance(value, str):
            for match in TIME.finditer(value):
                self._one(key, match.group(0))

    def _one(self, key: str, text: str) -> None:
        at = instant(text)
        if key in AHEAD:
            low, high = self.sent, self.answered + AHEAD[key]
        else:
            low, high = self.opened, self.answered
        assert low - ROUNDING <= at <= high + ROUNDING, (
            f"{key or 'time'} {text} is outside the call's window [{low.isoformat()}, {high.isoformat()}]"
        )
