"""How the server talks to model servers: retries, backoff, timeouts, and how many refused
tool calls a model may make in a row. Read once at start from ``ACP_MODEL_*`` variables."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class ModelSettings:
    # Further attempts after a 429, a 5xx, a connection failure or a timeout before the
    # first piece of text arrived.
    retries: int = 3
    # The first wait between attempts; it doubles per attempt, up to max_backoff_seconds.
    backoff_seconds: float = 0.5
    max_backoff_seconds: float = 8.0
    # A Retry-After above this is not waited for: the call fails at once, saying so.
    max_retry_after_seconds: float = 30.0
    connect_timeout_seconds: float = 10.0
    # The longest silence between two pieces of a streamed answer.
    read_timeout_seconds: float = 60.0
    # Unknown tools, arguments that are not JSON or a tool refused: answered to the model as
    # tool errors; this many in a row end the run.
    max_tool_errors: int = 3

    def __post_init__(self) -> None:
        for name, low, high in _BOUNDS:
            value = getattr(self, name)
            if not low <= value <= high:
                raise ValueError(f"{_ENV[name]} must be between {low:g} and {high:g}, not {value!r}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ModelSettings:
        """Settings from ``ACP_MODEL_RETRIES`` and the like; unset variables keep the defaults."""
        given: dict[str, int | float] = {}
        for item in fields(cls):
            raw = environ.get(_ENV[item.name], "").strip()
            if not raw:
                continue
            kind = int if item.type in ("int", int) else float
            try:
                given[item.name] = kind(raw)
            except ValueError:
                raise ValueError(f"{_ENV[item.name]} must be a number, not {raw!r}") from None
        return cls(**given)  # type: ignore[arg-type]


_ENV = {item.name: f"ACP_MODEL_{item.name.upper()}" for item in fields(ModelSettings)}
_BOUNDS: tuple[tuple[str, float, float], ...] = (
    ("retries", 0, 10),
    ("backoff_seconds", 0, 60),
    ("max_backoff_seconds", 0, 300),
    ("max_retry_after_seconds", 0, 600),
    ("connect_timeout_seconds", 0.1, 300),
    ("read_timeout_seconds", 0.1, 3600),
    ("max_tool_errors", 1, 100),
)
