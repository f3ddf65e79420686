"""Token counting for context assembly: a small protocol and a default that needs no download.

A real tokenizer can be plugged in by passing any ``TokenCounter`` to the context service;
the default estimate is the usual rule of thumb for BPE tokenizers on English and code,
about four bytes of UTF-8 per token.
"""

from __future__ import annotations

from typing import Protocol


class TokenCounter(Protocol):
    @property
    def description(self) -> str:
        """What ``context.show`` reports: the counter's name and how it counts."""
        ...

    def count(self, text: str) -> int: ...

    def truncate(self, text: str, max_tokens: int) -> str:
        """The longest prefix of ``text`` that counts at most ``max_tokens``."""
        ...


class ByteEstimateCounter:
    """``ceil(utf8_bytes / bytes_per_token)``: deterministic, cheap, and never under zero."""

    def __init__(self, bytes_per_token: int = 4) -> None:
        if bytes_per_token < 1:
            raise ValueError("bytes_per_token must be at least 1")
        self.bytes_per_token = bytes_per_token

    @property
    def description(self) -> str:
        return (
            f"estimate: ceil(UTF-8 bytes / {self.bytes_per_token}) tokens per text "
            "(no tokenizer download; see docs/context.md)"
        )

    def count(self, text: str) -> int:
        return -(-len(text.encode()) // self.bytes_per_token)

    def truncate(self, text: str, max_tokens: int) -> str:
        if max_tokens <= 0:
            return ""
        data = text.encode()
        limit = max_tokens * self.bytes_per_token
        if len(data) <= limit:
            return text
        # Cut back to a character boundary so the prefix stays valid UTF-8.
        return data[:limit].decode(errors="ignore")


DEFAULT_COUNTER: TokenCounter = ByteEstimateCounter()
