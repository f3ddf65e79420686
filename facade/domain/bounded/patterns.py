"""Regular expressions that callers write, run only by RE2, whose matching time is linear in
the text: no pattern can hold the event loop (``^(a+)+$`` took Python's ``re`` seconds).

Two dialects:

- ``ECMA``: JSON Schema's ``pattern`` and ``patternProperties`` (ECMA-262, as JSON Schema
  specifies), translated to RE2 so that ECMA-262 meaning is kept where RE2's differs:
  ``.`` excludes the four ECMA line terminators, ``\\s`` is ECMA's white space set,
  ``\\uXXXX``, ``\\u{X}``, ``\\cX``, ``\\0``, ``[^]`` (any) and ``[]`` (nothing) are rewritten,
  ``[`` inside a class is a plain character, and ``(?<name>`` is a named group. ``\\d``,
  ``\\w``, ``\\b`` (ASCII) and ``^``/``$`` (input edges) already mean the same in RE2.
  Characters are code points, as with ECMA-262's ``u`` flag. What RE2 cannot run in linear
  time is refused rather than run by a backtracking engine: backreferences (``\\1``,
  ``\\k<name>``) and lookaround (``(?=``, ``(?!``, ``(?<=``, ``(?<!``).
- ``RE2``: validation ``regex`` and invariant ``forbid_regex`` specs, in RE2's own syntax.

Every pattern is bounded (``MAX_PATTERN_LENGTH`` characters, ``MAX_PROGRAM_SIZE`` RE2
instructions, ``MAX_MEMORY_BYTES`` per compiled pattern) and compiled once: compiled patterns
are kept in a bounded LRU cache.
"""

from __future__ import annotations

import enum
from functools import lru_cache

import re2

MAX_PATTERN_LENGTH = 1000
MAX_PROGRAM_SIZE = 20_000
MAX_MEMORY_BYTES = 2 << 20
CACHE_SIZE = 256
# What RE2 says when compiling a pattern would take more than ``max_mem``.
_OVER_MEMORY = "pattern too large - compile failed"

# ECMA-262 WhiteSpace and LineTerminator code points (what ``\s`` matches), and the line
# terminators ``.`` does not match.
_ECMA_SPACE: tuple[tuple[int, int], ...] = (
    (0x09, 0x0D),
    (0x20, 0x20),
    (0xA0, 0xA0),
    (0x1680, 0x1680),
    (0x2000, 0x200A),
    (0x2028, 0x2029),
    (0x202F, 0x202F),
    (0x205F, 0x205F),
    (0x3000, 0x3000),
    (0xFEFF, 0xFEFF),
)
_LINE_TERMINATORS = r"\x{a}\x{d}\x{2028}\x{2029}"
_MAX_CODE_POINT = 0x10FFFF
_ANY = rf"[\x{{0}}-\x{{{_MAX_CODE_POINT:x}}}]"
_NOTHING = rf"[^\x{{0}}-\x{{{_MAX_CODE_POINT:x}}}]"
_HEX = frozenset("0123456789abcdefABCDEF")
# Escapes that mean the same in ECMA-262 and RE2.
_SAME_ESCAPES = frozenset("dDwWtnrfv")
_SAME_OUTSIDE_CLASSES = frozenset("bB")
_LINEAR = "patterns run with RE2, in time linear in the text"


class Dialect(enum.Enum):
    ECMA = "ECMA-262"
    RE2 = "RE2"


class PatternError(ValueError):
    """The pattern cannot be used; the message says why, for the caller."""


def _ranges(ranges: tuple[tuple[int, int], ...]) -> str:
    return "".join(rf"\x{{{lo:x}}}" if lo == hi else rf"\x{{{lo:x}}}-\x{{{hi:x}}}" for lo, hi in ranges)


def _complement(ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    out: list[tuple[int, int]] = []
    start = 0
    for low, high in ranges:
        if low > start:
            out.append((start, low - 1))
        start = high + 1
    if start <= _MAX_CODE_POINT:
        out.append((start, _MAX_CODE_POINT))
    return tuple(out)


_SPACE_ITEMS = _ranges(_ECMA_SPACE)
_NON_SPACE_ITEMS = _ranges(_complement(_ECMA_SPACE))


def _code_point(value: int) -> str:
    if 0xD800 <= value <= 0xDFFF:
        raise PatternError(f"a lone surrogate (\\u{value:04x}) cannot be matched in Unicode text")
    if value > _MAX_CODE_POINT:
        raise PatternError(f"\\u{{{value:x}}} is beyond the last Unicode code point")
    return rf"\x{{{value:x}}}"


class _EcmaTranslator:
    """One left-to-right pass over an ECMA-262 pattern, writing the RE2 pattern."""

    def __init__(self, pattern: str) -> None:
        self.src = pattern
        self.i = 0
        self.out: list[str] = []
        self.in_class = False

    def translate(self) -> str:
        src = self.src
        while self.i < len(src):
            char = src[self.i]
            if char == "\\":
                self._escape()
            elif self.in_class:
                self._class_char(char)
            elif char == "[":
                self._open_class()
            elif char == "(":
                self._group()
            elif char == ".":
                self.out.append(f"[^{_LINE_TERMINATORS}]")
                self.i += 1
            else:
                self.out.append(char)
                self.i += 1
        if self.in_class:
            raise PatternError("a character class is not closed with ]")
        return "".join(self.out)

    def _class_char(self, char: str) -> None:
        if char == "]":
            self.in_class = False
            self.out.append("]")
        elif char == "[":
            self.out.append(r"\[")
        else:
            self.out.append(char)
        self.i += 1

    def _open_class(self) -> None:
        rest = self.src[self.i :]
        if rest.startswith("[^]"):
            self.out.append(_ANY)
            self.i += 3
        elif rest.startswith("[]"):
            self.out.append(_NOTHING)
            self.i += 2
        else:
            negated = rest.startswith("[^")
            self.out.append("[^" if negated else "[")
            self.i += 2 if negated else 1
            self.in_class = True

    def _group(self) -> None:
        rest = self.src[self.i :]
        for lookaround in ("(?=", "(?!", "(?<=", "(?<!"):
            if rest.startswith(lookaround):
                kind = "lookahead" if lookaround[2] in "=!" else "lookbehind"
                raise PatternError(f"{kind} ({lookaround}...)) is not supported: {_LINEAR}")
        if rest.startswith("(?<"):
            self.out.append("(?P<")
            self.i += 3
        else:
            self.out.append("(")
            self.i += 1

    def _hex(self, start: int, count: int) -> int | None:
        digits = self.src[start : start + count]
        if len(digits) == count and all(d in _HEX for d in digits):
            return int(digits, 16)
        return None

    def _unicode_escape(self) -> str:
        """``\\uXXXX`` (a surrogate pair as one code point) or ``\\u{X...}``; self.i at the u."""
        src = self.src
        if src.startswith("{", self.i + 1):
            end = src.find("}", self.i + 2)
            digits = src[self.i + 2 : end] if end != -1 else ""
            if not digits or not all(d in _HEX for d in digits):
                raise PatternError("\\u{...} needs hexadecimal digits")
            self.i = end + 1
            return _code_point(int(digits, 16))
        value = self._hex(self.i + 1, 4)
        if value is None:
            raise PatternError("\\u needs four hexadecimal digits")
        self.i += 5
        if 0xD800 <= value <= 0xDBFF and src.startswith("\\u", self.i):
            low = self._hex(self.i + 2, 4)
            if low is not None and 0xDC00 <= low <= 0xDFFF:
                self.i += 6
                return _code_point(0x10000 + ((value - 0xD800) << 10) + (low - 0xDC00))
        return _code_point(value)

    def _escape(self) -> None:
        src = self.src
        if self.i + 1 >= len(src):
            raise PatternError("the pattern ends with a lone backslash")
        self.i += 1
        char = src[self.i]
        if char in "123456789":
            raise PatternError(f"backreferences (\\{char}) are not supported: {_LINEAR}")
        if char == "k" and src.startswith("<", self.i + 1):
            raise PatternError(f"backreferences (\\k<name>) are not supported: {_LINEAR}")
        if char == "u":
            self.out.append(self._unicode_escape())
            return
        self.i += 1
        if char in _SAME_ESCAPES or (char in _SAME_OUTSIDE_CLASSES and not self.in_class):
            self.out.append("\\" + char)
        elif char == "b":
            self.out.append(r"\x{8}")
        elif char in "sS":
            items = _SPACE_ITEMS if char == "s" else _NON_SPACE_ITEMS
            self.out.append(items if self.in_class else f"[{items}]")
        elif char == "0":
            if src[self.i : self.i + 1].isdigit():
                raise PatternError("octal escapes (\\0 followed by a digit) are not supported")
            self.out.append(r"\x{0}")
        elif char == "x":
            value = self._hex(self.i, 2)
            if value is None:
                raise PatternError("\\x needs two hexadecimal digits")
            self.i += 2
            self.out.append(_code_point(value))
        elif char == "c":
            letter = src[self.i : self.i + 1]
            if not (letter.isascii() and letter.isalpha()):
                raise PatternError("\\c needs a letter A-Z or a-z")
            self.i += 1
            self.out.append(_code_point(ord(letter) % 32))
        elif char in "pP":
            self.out.append(self._property(char))
        elif char.isascii() and char.isalnum():
            raise PatternError(f"\\{char} is not an escape of ECMA-262 regular expressions")
        else:
            self.out.append(re2.escape(char))

    def _property(self, letter: str) -> str:
        """``\\p{Name}`` / ``\\p{Script=Name}`` / ``\\p{General_Category=Name}``; self.i past the p."""
        src = self.src
        end = src.find("}", self.i)
        if not src.startswith("{", self.i) or end == -1:
            raise PatternError(f"\\{letter} needs a property name in braces")
        name = src[self.i + 1 : end]
        self.i = end + 1
        key, sep, value = name.partition("=")
        if sep:
            if key not in ("Script", "sc", "General_Category", "gc", "Script_Extensions", "scx"):
                raise PatternError(f"the Unicode property {key!r} is not supported")
            name = value
        if not name or not all(c.isascii() and (c.isalnum() or c == "_") for c in name):
            raise PatternError(f"{name!r} is not a Unicode property name")
        return f"\\{letter}{{{name}}}"


def translate_ecma(pattern: str) -> str:
    """The RE2 pattern with the ECMA-262 meaning of ``pattern``, or PatternError."""
    return _EcmaTranslator(pattern).translate()


def _options() -> re2.Options:
    options = re2.Options()
    options.max_mem = MAX_MEMORY_BYTES
    options.log_errors = False
    return options


def _reason(exc: re2.error) -> str:
    reason = exc.args[0] if exc.args else str(exc)
    return reason.decode("utf-8", errors="replace") if isinstance(reason, bytes) else str(reason)


@lru_cache(maxsize=CACHE_SIZE)
def _compile(pattern: str, dialect: Dialect, multiline: bool) -> re2._Regexp[str]:
    if len(pattern) > MAX_PATTERN_LENGTH:
        raise PatternError(f"it is {len(pattern)} characters long; at most {MAX_PATTERN_LENGTH} are allowed")
    source = translate_ecma(pattern) if dialect is Dialect.ECMA else pattern
    if multiline:
        source = "(?m)" + source
    try:
        compiled = re2.compile(source, _options())
    except re2.error as exc:
        reason = _reason(exc)
        if reason == _OVER_MEMORY:
            raise PatternError(
                f"it needs more than the {MAX_MEMORY_BYTES >> 20} MiB of RE2 memory a pattern may use"
            ) from None
        raise PatternError(f"it is not a valid {dialect.value} regular expression ({reason})") from None
    if compiled.programsize > MAX_PROGRAM_SIZE:
        raise PatternError(
            f"it compiles to {compiled.programsize} RE2 instructions; at most {MAX_PROGRAM_SIZE} are allowed"
        )
    return compiled


def compiled(pattern: str, dialect: Dialect, *, multiline: bool = False) -> re2._Regexp[str]:
    """The compiled pattern (cached), or PatternError saying why it cannot be used."""
    return _compile(pattern, dialect, multiline)


def search(pattern: str, text: str, dialect: Dialect = Dialect.ECMA) -> bool:
    """Whether ``pattern`` is found anywhere in ``text`` (JSON Schema's reading of a pattern)."""
    return compiled(pattern, dialect).search(text) is not None
