"""Duplicate JSON keys: found exactly, whatever the strings hold."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleveragents.acp.contract import strict_json

KEYS = st.text(alphabet=':"\\ab\u00e9{}[],', max_size=6)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(alphabet=':"\\ x{}', max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=15,
)


@settings(max_examples=300, deadline=None, database=None)
@given(value=JSON)
def test_text_without_repeated_keys_passes(value: Any) -> None:
    for text in (json.dumps(value).encode(), orjson.dumps(value), json.dumps(value, indent=1).encode()):
        assert strict_json.loads(text) == value


@settings(max_examples=300, deadline=None, database=None)
@given(value=st.dictionaries(KEYS, JSON, min_size=1, max_size=4), outer=st.booleans())
def test_a_repeated_key_anywhere_is_refused(value: dict[str, Any], outer: bool) -> None:
    key = next(iter(value))
    inner = json.dumps(value)
    text = inner[:-1] + (", " if len(inner) > 2 else "") + f"{json.dumps(key)}: 1}}"
    if outer:
        text = json.dumps({"a:": [1, "x:y"]})[:-1] + f', "params": {text}}}'
    with pytest.raises(strict_json.DuplicateKeyError) as caught:
        strict_json.loads(text.encode())
    assert caught.value.key == key


def test_the_refusal_names_the_key() -> None:
    with pytest.raises(strict_json.DuplicateKeyError, match="'plan_id' appears twice"):
        strict_json.loads(b'{"params": {"plan_id": "a", "x": "t:1", "plan_id": "b"}}')
    with pytest.raises(orjson.JSONDecodeError):
        strict_json.loads(b'{"a": ')
    assert strict_json.loads(b'{"a": "\\":", "b": {"\\u003a": 1}}') == {"a": '":', "b": {":": 1}}
