"""Session ids (sessions/records.py: new_id): ULIDs as python-ulid makes them, from buffered OS bytes."""

from __future__ import annotations

import os

from ulid import ULID

from cleveragents.acp.facade.domain.sessions.records import new_id, now


def test_ids_are_ulids_of_their_instant_made_in_order_and_never_twice() -> None:
    stamps = [now() for _ in range(20_000)]
    ids = [new_id(stamp) for stamp in stamps]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    for stamp, text in list(zip(stamps, ids, strict=True))[:: len(ids) // 50]:
        parsed = ULID.from_str(text)
        assert str(parsed) == text
        assert parsed.milliseconds == stamp.seconds * 1000 + stamp.nanos // 1_000_000
    # A new millisecond draws new random bits (the buffer goes on; no id is the last + 1).
    by_ms: dict[int, list[int]] = {}
    for text in ids:
        parsed = ULID.from_str(text)
        by_ms.setdefault(parsed.milliseconds, []).append(int(parsed))
    firsts = [values[0] for _, values in sorted(by_ms.items())]
    lasts = [values[-1] for _, values in sorted(by_ms.items())]
    assert all(first != last + 1 for first, last in zip(firsts[1:], lasts, strict=False))


def test_a_forked_child_makes_none_of_its_parents_ids() -> None:
    new_id(now())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its ids, then gone
        os.close(read)
        os.write(write, "".join(new_id(now()) for _ in range(400)).encode())
        os._exit(0)
    os.close(write)
    parents = {new_id(now()) for _ in range(400)}
    with os.fdopen(read, "rb") as pipe:
        text = pipe.read().decode()
    os.waitpid(pid, 0)
    childs = {text[i : i + 26] for i in range(0, len(text), 26)}
    assert len(childs) == 400
    assert not parents & childs
