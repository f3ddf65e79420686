"""How ids, times and enum values read on screen: one place, so a test can make them stable
(its snapshots must not change with the ULIDs and clocks of a run)."""

from __future__ import annotations

from typing import Any

from google.protobuf import timestamp_pb2


class Display:
    """Shows ids whole and times as UTC ``YYYY-MM-DD HH:MM:SS``."""

    def id(self, value: str) -> str:
        return value

    def text(self, value: str) -> str:
        """Free text (a message, an error) as shown; it may name ids."""
        return value

    def time(self, value: timestamp_pb2.Timestamp) -> str:
        if not value.seconds and not value.nanos:
            return "-"
        return value.ToDatetime().strftime("%Y-%m-%d %H:%M:%S")

    def seconds(self, value: float) -> str:
        return f"{value:.1f}s"


def enum(wrapper: Any, value: int) -> str:
    """``PLAN_STATE_RUNNING`` as ``running``."""
    name: str = wrapper.Name(value)
    prefix = wrapper.DESCRIPTOR.name
    snake = "".join("_" + c.lower() if c.isupper() else c for c in prefix).lstrip("_").upper() + "_"
    return name.removeprefix(snake).lower()
