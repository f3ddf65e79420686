"""``Recent``: bounded, and what it was given last is what it answers."""

from __future__ import annotations

import pytest

from cleveragents.acp.contract.recent import Recent


def test_recent_values_are_found_and_the_size_is_bounded() -> None:
    recent: Recent[int, str] = Recent(4)
    for key in range(100):
        recent.put(key, str(key))
        assert recent.get(key) == str(key)
        assert len(recent) <= 8
    assert recent.get(99) == "99"
    assert recent.get(0) is None


def test_a_value_in_use_survives_a_generation() -> None:
    recent: Recent[int, str] = Recent(2)
    recent.put(1, "one")
    recent.put(2, "two")
    recent.put(3, "three")  # 1 and 2 are now the old generation
    assert recent.get(1) == "one"  # moved back to the new one
    recent.put(4, "four")
    recent.put(5, "five")
    assert recent.get(1) == "one"
    assert recent.get(2) is None


def test_a_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="size"):
        Recent(0)
