"""One streamed chat-completions answer, assembled from its chunks: the text, the tool calls
(whose id, name and arguments arrive in pieces spread over chunks, keyed by ``index``), why
it finished, and the usage the server reports in a last chunk (``stream_options``).

A stream that ends without a ``finish_reason`` was cut short; a chunk of the wrong shape is
a broken stream. Both are ``ModelError("model_stream_broken")``. Sizes are bounded so a
runaway server cannot fill the memory of ours.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cleveragents.acp.facade.domain.models.failures import ModelError

MAX_TURN_CHARS = 1_000_000
MAX_TOOL_CALLS = 64
MAX_ARGUMENT_CHARS = 262_144


@dataclass
class ToolCall:
    id: str
    # The function name as the model wrote it.
    name: str
    # JSON text, as the model wrote it (it may not parse).
    arguments: str


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int

    @property
    def total(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Turn:
    text: str
    tool_calls: list[ToolCall]
    finish_reason: str
    # None when the server reported none.
    usage: Usage | None


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)
    size: int = 0


def _broken(message: str) -> ModelError:
    return ModelError("model_stream_broken", message)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


class TurnBuilder:
    """Feed it chunks in order (``add`` returns the new text); ``finish`` gives the turn."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self.chars = 0
        self._calls: dict[int, _Call] = {}
        self._finish = ""
        self._usage: Usage | None = None

    def add(self, chunk: Any) -> str:
        try:
            return self._add(chunk)
        except (AttributeError, TypeError, KeyError) as exc:
            raise _broken(f"the model server sent a chunk of an unexpected shape ({exc})") from None

    def _add(self, chunk: Any) -> str:
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self._usage = Usage(_int(usage.prompt_tokens), _int(usage.completion_tokens))
        choices = chunk.choices
        if choices is None:
            if usage is None:
                raise _broken("the model server sent a chunk with neither choices nor usage")
            return ""
        text = ""
        for choice in choices:
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    text += delta.content
                for piece in delta.tool_calls or ():
                    self._tool_piece(piece)
            if choice.finish_reason:
                self._finish = str(choice.finish_reason)
        if text:
            self.chars += len(text)
            if self.chars > MAX_TURN_CHARS:
                raise _broken(f"the model wrote more than {MAX_TURN_CHARS} characters in one turn")
            self._text.append(text)
        return text

    def _tool_piece(self, piece: Any) -> None:
        index = piece.index if isinstance(piece.index, int) else len(self._calls)
        call = self._calls.get(index)
        if call is None:
            if len(self._calls) >= MAX_TOOL_CALLS:
                raise _broken(f"the model called more than {MAX_TOOL_CALLS} tools in one turn")
            call = self._calls[index] = _Call()
        if piece.id:
            call.id = str(piece.id)
        function = piece.function
        if function is not None:
            if function.name:
                call.name += str(function.name)
            if function.arguments:
                call.size += len(function.arguments)
                if call.size > MAX_ARGUMENT_CHARS:
                    raise _broken(f"the model wrote more than {MAX_ARGUMENT_CHARS} characters of arguments")
                call.arguments.append(str(function.arguments))

    def finish(self) -> Turn:
        if not self._finish:
            raise _broken(
                "the model's answer ended before it finished (no finish_reason): the stream was cut"
            )
        calls = []
        for position, (_, call) in enumerate(sorted(self._calls.items())):
            if not call.name:
                raise _broken(f"the model's tool call {position + 1} has no function name")
            calls.append(ToolCall(call.id or f"call_{position + 1}", call.name, "".join(call.arguments)))
        return Turn("".join(self._text), calls, self._finish, self._usage)

    def cut(self) -> Turn:
        """What arrived so far, when the caller stops reading early."""
        calls = [ToolCall(c.id, c.name, "".join(c.arguments)) for _, c in sorted(self._calls.items())]
        return Turn("".join(self._text), calls, self._finish or "stopped", self._usage)
