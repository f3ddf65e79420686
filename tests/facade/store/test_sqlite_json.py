"""Record attrs and labels are read back by orjson, with json's answer for what orjson
refuses: the same value either way."""

from __future__ import annotations

import json
import math

import pytest

from cleveragents.acp.facade.store.sqlite import _json, _loads


@pytest.mark.parametrize(
    "value",
    [
        {},
        {"a": "b", "team": "x"},
        {"unicode": "é\u2028😀", "empty": "", "quote": '"\\'},
        {"lone": "\ud800"},
        {"n": 10**30, "f": 0.1, "neg": -0.0, "nested": {"list": [1, "2", None, True]}},
    ],
)
def test_what_json_wrote_reads_back_as_json_reads_it(value: dict[str, object]) -> None:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    assert _loads(text) == json.loads(text)
    assert type(_loads(text)) is dict


def test_values_orjson_refuses_are_read_by_json() -> None:
    assert math.isnan(_loads('{"x": NaN}')["x"])
    assert _loads('{"x": "\\ud800"}') == {"x": "\ud800"}
    assert _loads(_json({"k": "v"})) == {"k": "v"}
