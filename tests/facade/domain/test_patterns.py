"""Caller regexes: ECMA-262 meaning over RE2, refusals, bounds, and time linear in the text."""

from __future__ import annotations

import re
import time
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleveragents.acp.facade.domain.bounded import patterns
from cleveragents.acp.facade.domain.bounded.patterns import Dialect, PatternError

# Far longer than a backtracking engine could take on these (``^(a+)+$`` doubled per
# character from 3.2 s at 26); generous so a loaded machine never trips it.
QUICK_SECONDS = 2.0
PATHOLOGICAL = [
    ("^(a+)+$", "a" * 5000 + "!"),
    ("^(a|a)*$", "a" * 5000 + "!"),
    ("^(a|aa)+$", "a" * 5000 + "!"),
    ("(.*a){20}", "a" * 5000),
    ("^([a-z]+\\s?)+$", "word " * 2000 + "!"),
]


@pytest.mark.parametrize(("pattern", "text"), PATHOLOGICAL)
@pytest.mark.parametrize("dialect", list(Dialect))
def test_catastrophic_backtracking_patterns_run_in_linear_time(
    pattern: str, text: str, dialect: Dialect
) -> None:
    began = time.monotonic()
    patterns.compiled(pattern, dialect).search(text)
    assert time.monotonic() - began < QUICK_SECONDS


ECMA_MEANINGS = [
    # (pattern, text, found): where ECMA-262 and RE2 (or Python) read a pattern differently.
    ("^.$", "\u2028", False),
    ("^.$", "\r", False),
    ("^.$", "\U0001f600", True),
    ("^\\s$", "\u3000", True),
    ("^\\s$", "\ufeff", True),
    ("^[\\s]$", "\u00a0", True),
    ("^\\S$", "\u2000", False),
    ("^[\\S]$", "x", True),
    ("^\\d$", "\u0663", False),
    ("^\\w$", "é", False),
    ("^a$", "a\n", False),
    ("^\\u0041\\u{1F600}$", "A\U0001f600", True),
    ("^\\uD83D\\uDE00$", "\U0001f600", True),
    ("^[\\u0041-\\u005A]+$", "HELLO", True),
    ("^\\x41\\cJ\\0$", "A\n\x00", True),
    ("^[^]$", "\n", True),
    ("[]", "anything", False),
    ("^[[:a]$", ":", True),
    ("^[\\b]$", "\b", True),
    ("\\bword\\b", "a word here", True),
    ("^(?<year>\\d{4})-\\d\\d$", "2024-05", True),
    ("^\\p{Script=Greek}+$", "αβγ", True),
    ("^\\p{L}+$", "Ωmega", True),
    ("^a{2}$", "aa", True),
    ("a{", "a{", True),
    ("^\\/$", "/", True),
    ("^[a\\-z]$", "-", True),
]


@pytest.mark.parametrize(("pattern", "text", "found"), ECMA_MEANINGS)
def test_ecma_262_meaning_is_kept_where_re2_differs(pattern: str, text: str, found: bool) -> None:
    assert patterns.search(pattern, text) is found


REFUSED = [
    ("(a)\\1", "backreferences (\\1)"),
    ("(?<n>a)\\k<n>", "backreferences (\\k<name>)"),
    ("a(?=b)", "lookahead ((?=...))"),
    ("a(?!b)", "lookahead ((?!...))"),
    ("(?<=a)b", "lookbehind ((?<=...))"),
    ("(?<!a)b", "lookbehind ((?<!...))"),
    ("\\a", "\\a is not an escape"),
    ("\\z", "\\z is not an escape"),
    ("\\u12", "\\u needs four hexadecimal digits"),
    ("\\uD800", "lone surrogate"),
    ("\\u{110000}", "beyond the last Unicode code point"),
    ("\\01", "octal escapes"),
    ("[abc", "not closed"),
    ("abc\\", "lone backslash"),
    ("(", "not a valid ECMA-262 regular expression"),
    ("a{1001}", "not a valid ECMA-262 regular expression"),
    ("\\p{Nope=X}", "not supported"),
]


@pytest.mark.parametrize(("pattern", "reason"), REFUSED)
def test_what_cannot_run_in_linear_time_or_is_not_ecma_262_is_refused(pattern: str, reason: str) -> None:
    with pytest.raises(PatternError) as caught:
        patterns.compiled(pattern, Dialect.ECMA)
    assert reason in str(caught.value)


def test_re2_dialect_takes_re2_syntax_and_refuses_the_same_constructs() -> None:
    assert patterns.compiled("\\Aab\\z", Dialect.RE2).search("ab") is not None
    assert patterns.compiled("^b$", Dialect.RE2, multiline=True).search("a\nb\nc") is not None
    assert patterns.compiled("^b$", Dialect.RE2).search("a\nb\nc") is None
    for pattern in ("(a)\\1", "(?=a)", "(?<!a)"):
        with pytest.raises(PatternError, match="not a valid RE2 regular expression"):
            patterns.compiled(pattern, Dialect.RE2)


def test_length_and_program_size_are_bounded() -> None:
    patterns.compiled("a" * patterns.MAX_PATTERN_LENGTH, Dialect.RE2)
    with pytest.raises(PatternError, match="1001 characters long; at most 1000"):
        patterns.compiled("a" * (patterns.MAX_PATTERN_LENGTH + 1), Dialect.RE2)
    with pytest.raises(PatternError, match="RE2 instructions; at most 20000"):
        patterns.compiled("\\p{L}{20}", Dialect.ECMA)


def test_a_pattern_needing_more_than_the_memory_cap_is_refused_for_it() -> None:
    """Every pattern compiles (and its DFA runs) within ``MAX_MEMORY_BYTES``; one that needs
    more is refused for that, before any program size is known (RE2's own default, 8 MiB,
    would compile it: 239,204 instructions)."""
    assert patterns.compiled("a+b", Dialect.RE2).options.max_mem == patterns.MAX_MEMORY_BYTES
    with pytest.raises(PatternError, match="needs more than the 2 MiB of RE2 memory"):
        patterns.compiled("\\p{L}{200}", Dialect.ECMA)


def test_compiled_patterns_are_cached_and_the_cache_is_bounded() -> None:
    first = patterns.compiled("cache-me", Dialect.ECMA)
    assert patterns.compiled("cache-me", Dialect.ECMA) is first
    for i in range(patterns.CACHE_SIZE + 10):
        patterns.compiled(f"filler{i}", Dialect.RE2)
    assert patterns._compile.cache_info().currsize <= patterns.CACHE_SIZE


# Patterns over a small alphabet whose reading ECMA-262 and Python's re share (no '{', no
# '$' before a newline, no '[]' or '[^]', no '(?'): RE2 must find what Python finds.
_SHARED = st.text(alphabet="ab|()*+?[]^.-\\dw", max_size=10).filter(
    lambda p: "[]" not in p and "[^]" not in p and "(?" not in p
)


@given(pattern=_SHARED, text=st.text(alphabet="ab-1 _", max_size=8))
@settings(max_examples=300, deadline=None)
def test_on_the_shared_subset_re2_finds_what_python_finds(pattern: str, text: str) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "possible nested set": still literal
            expected = re.search(pattern, text, re.ASCII) is not None
    except re.error:
        return
    try:
        found = patterns.search(pattern, text)
    except PatternError:
        return
    assert found is expected, (pattern, text)


@given(pattern=st.text(max_size=40), text=st.text(max_size=40))
@settings(max_examples=300, deadline=None)
def test_any_pattern_compiles_or_is_refused_with_a_reason(pattern: str, text: str) -> None:
    for dialect in Dialect:
        try:
            compiled = patterns.compiled(pattern, dialect)
        except PatternError as exc:
            reason = str(exc)
        else:
            reason = "compiled"
            compiled.search(text)
        assert reason
