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

import orjson

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
    """Feed it the decoded JSON chunks in order (``add`` returns the new text); ``finish``
    gives the turn."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self.chars = 0
        self._calls: dict[int, _Call] = {}
        self._finish = ""
        self._usage: Usage | None = None

    def add(self, chunk: Any) -> str:
        try:
            return self._add(chunk)
        except (AttributeError, TypeError, KeyError, ValueError) as exc:
            raise _broken(f"the model server sent a chunk of an unexpected shape ({exc!r})") from None

    def _add(self, chunk: dict[str, Any]) -> str:
        usage = chunk.get("usage")
        if usage:
            self._usage = Usage(_int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens")))
        choices = chunk.get("choices")
        if choices is None:
            if not usage:
                raise _broken("the model server sent a chunk with neither choices nor usage")
            return ""
        text = ""
        for choice in choices:
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if delta:
                content = delta.get("content")
                if content:
                    text += str(content)
                for piece in delta.get("tool_calls") or ():
                    self._tool_piece(piece)
            if choice.get("finish_reason"):
                self._finish = str(choice["finish_reason"])
        if text:
            self.chars += len(text)
            if self.chars > MAX_TURN_CHARS:
                raise _broken(f"the model wrote more than {MAX_TURN_CHARS} characters in one turn")
            self._text.append(text)
        return text

    def _tool_piece(self, piece: dict[str, Any]) -> None:
        index = piece.get("index")
        if not isinstance(index, int):
            index = len(self._calls)
        call = self._calls.get(index)
        if call is None:
            if len(self._calls) >= MAX_TOOL_CALLS:
                raise _broken(f"the model called more than {MAX_TOOL_CALLS} tools in one turn")
            call = self._calls[index] = _Call()
        if piece.get("id"):
            call.id = str(piece["id"])
        function = piece.get("function")
        if function:
            if function.get("name"):
                call.name += str(function["name"])
            arguments = function.get("arguments")
            if arguments:
                call.size += len(arguments)
                if call.size > MAX_ARGUMENT_CHARS:
                    raise _broken(f"the model wrote more than {MAX_ARGUMENT_CHARS} characters of arguments")
                call.arguments.append(str(arguments))

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


class StreamEndError(Exception):
    """``data: [DONE]``: the server's end of the stream."""


class SSEReader:
    """Server-sent events from the lines of a response: ``data:`` lines joined until a blank
    line, comments (``:``) skipped; yields each event's data decoded as JSON, raises
    ``StreamEndError`` at ``[DONE]``. An ``error`` event or a JSON body with ``error`` is the
    server reporting a failure mid-stream."""

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event = ""

    def line(self, line: str) -> Any:
        """Feed one line; returns the decoded data when an event is complete, else None."""
        if line:
            if line.startswith(":"):
                return None
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "data":
                if value == "[DONE]" and not self._data:
                    raise StreamEndError()
                self._data.append(value)
            elif field == "event":
                self._event = value
            return None
        if not self._data:
            return None
        data, event = "\n".join(self._data), self._event
        self._data, self._event = [], ""
        try:
            decoded = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise _broken(f"the model server sent a malformed chunk ({exc})") from None
        if event == "error" or (isinstance(decoded, dict) and decoded.get("error")):
            error = decoded.get("error") if isinstance(decoded, dict) else None
            message = error.get("message") if isinstance(error, dict) else error
            raise _broken(
                f"the model server reported an error in its stream: {str(message or decoded)[:300]}"
            )
        if not isinstance(decoded, dict):
            raise _broken("the model server sent a chunk that is not a JSON object")
        return decoded

    @property
    def pending(self) -> bool:
        return bool(self._data)
