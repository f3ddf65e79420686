"""The state of one benchmark run: its mode, scratch folder and what it measured so far."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field
from typing import Any

from bench.modes import Mode


@dataclass
class Run:
    mode: Mode
    workdir: pathlib.Path
    # Load generators: "auto" (C tools when installed), "c" or "python".
    prefer: str = "auto"
    figures: dict[str, float] = field(default_factory=dict)
    measured_by: dict[str, str] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def record(self, name: str, value: float, by: str | None = None) -> None:
        self.figures[name] = round(float(value), 4)
        if by is not None:
            self.measured_by[name] = by

    def note(self, name: str, value: Any) -> None:
        self.details[name] = round(value, 4) if isinstance(value, float) else value

    def scratch(self, name: str) -> pathlib.Path:
        folder = self.workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        return folder
