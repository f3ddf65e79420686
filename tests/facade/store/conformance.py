"""The ``Store`` contract, written once and run over every backend: ``test_conformance.py``
runs ``StoreConformance`` with ``open_store`` giving a fresh SQLite file or a fresh
PostgreSQL schema (tests/facade/store/conftest.py). Longer than 600 lines: it is one
class, the whole ``Store`` contract, each method a case any backend must pass."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from cleveragents.acp.facade.store.base import (
    EventFilter,
    Lease,
    LeaseHeldError,
    LeaseLostError,
    ListQuery,
    Record,
    StaleRevisionError,
    Store,
    StoreConflictError,
    StoredEvent,
)
from cleveragents.acp.facade.store.requests import CLAIM, Claim, RequestClaimedError, RequestEntry


def record(kind: str = "session", id: str = "01A", namespace: str = "default", **kw: Any) -> Record:
    now = time.time()
    fields: dict[str, Any] = {"body": b"body-" + id.encode(), "create_time": now, "update_time": now}
    fields.update(kw)
    return Record(kind=kind, id=id, namespace=namespace, **fields)


def event(
    namespace: str = "default",
    type: str = "plan.created",
    plan_id: str = "",
    session_id: str = "",
    when: float | None = None,
) -> StoredEvent:
    return StoredEvent(
        sequence=0,
        namespace=namespace,
        type=type,
        plan_id=plan_id,
        session_id=session_id,
        time=time.time() if when is None else when,
        body=f"{namespace}/{type}/{plan_id}/{session_id}".encode(),
    )


def request_entry(owner: str = "owner-1", time: float = 1000.0, request_id: str = "r-1") -> RequestEntry:
    return RequestEntry(
        principal="alice",
        request_id=request_id,
        operation="session.create",
        digest=b"\x01" * 32,
        owner=owner,
        time=time,
    )


def fails_in_transaction(store: Store, body: Callable[[], object]) -> None:
    """Run ``body`` in a transaction that then fails (so it must roll back)."""
    with pytest.raises(RuntimeError, match="abort"):
        _abort(store, body)


def _abort(store: Store, body: Callable[[], object]) -> None:
    with store.transaction():
        body()
        raise RuntimeError("abort")


class StoreConformance:
    """Needs ``open_store`` (a new store on the test's database each call) and ``store``."""

    # records --------------------------------------------------------------------------

    def test_insert_get_and_get_by_name(self, store: Store) -> None:
        rec = record(id="01A", name="alpha", state="active", attrs={"project": "p"}, labels={"team": "x"})
        store.insert(rec)
        got = store.get("session", "01A")
        assert got is not None
        assert (got.name, got.state, got.attrs, got.labels, got.body) == (
            "alpha",
            "active",
            {"project": "p"},
            {"team": "x"},
            b"body-01A",
        )
        assert store.get_by_name("session", "default", "alpha") == got
        assert store.get("session", "nope") is None
        assert store.get("plan", "01A") is None
        assert store.get_by_name("session", "other", "alpha") is None

    def test_duplicates_conflict(self, store: Store) -> None:
        store.insert(record(id="01A", name="alpha"))
        with pytest.raises(StoreConflictError):
            store.insert(record(id="01A", name="beta"))
        with pytest.raises(StoreConflictError):
            store.insert(record(id="01B", name="alpha"))
        # The same name in another namespace or kind, and unnamed records, are fine.
        store.insert(record(id="01C", name="alpha", namespace="other"))
        store.insert(record(kind="plan", id="01D", name="alpha"))
        store.insert(record(id="01E"))
        store.insert(record(id="01F"))

    def test_update_checks_revision(self, store: Store) -> None:
        store.insert(record(id="01A", name="alpha"))
        changed = record(id="01A", name="alpha", revision=2, state="closed", body=b"new")
        store.update(changed, expected_revision=1)
        got = store.get("session", "01A")
        assert got is not None
        assert (got.revision, got.state, got.body) == (2, "closed", b"new")
        with pytest.raises(StaleRevisionError) as info:
            store.update(record(id="01A", revision=3), expected_revision=1)
        assert info.value.current == 2
        with pytest.raises(KeyError):
            store.update(record(id="01Z"))

    def test_delete(self, store: Store) -> None:
        store.insert(record(id="01A"))
        with pytest.raises(StaleRevisionError):
            store.delete("session", "01A", expected_revision=7)
        assert store.delete("session", "01A", expected_revision=1) is True
        assert store.delete("session", "01A") is False
        assert store.get("session", "01A") is None

    def test_query_filters_and_pages_newest_first(self, store: Store) -> None:
        for i in range(6):
            store.insert(
                record(
                    id=f"01{i}",
                    namespace="a" if i % 2 else "b",
                    state="active" if i < 4 else "closed",
                    attrs={"project": "p" if i < 3 else "q"},
                    labels={"even": str(i % 2 == 0)},
                )
            )
        store.insert(record(kind="plan", id="019"))
        ids = [r.id for r in store.query(ListQuery(kind="session"))]
        assert ids == ["015", "014", "013", "012", "011", "010"]
        assert [r.id for r in store.query(ListQuery(kind="session", namespaces=frozenset({"a"})))] == [
            "015",
            "013",
            "011",
        ]
        assert store.query(ListQuery(kind="session", namespaces=frozenset())) == []
        assert [r.id for r in store.query(ListQuery(kind="session", state="closed"))] == ["015", "014"]
        assert [r.id for r in store.query(ListQuery(kind="session", attrs={"project": "p"}))] == [
            "012",
            "011",
            "010",
        ]
        assert [r.id for r in store.query(ListQuery(kind="session", labels={"even": "True"}))] == [
            "014",
            "012",
            "010",
        ]
        first = store.query(ListQuery(kind="session", limit=4))
        rest = store.query(ListQuery(kind="session", limit=4, before_id=first[-1].id))
        assert [r.id for r in first + rest] == ids

    def test_filtered_lists_follow_updates_deletes_and_namespaces(self, store: Store) -> None:
        for i in range(8):
            store.insert(
                record(
                    id=f"02{i}",
                    namespace="abc"[i % 3],
                    state="closed" if i % 2 else "active",
                    attrs={"project": "p" if i < 4 else "q", "empty": ""},
                    labels={"team": "x" if i in (1, 6) else "y"},
                )
            )

        def ids(**fields: Any) -> list[str]:
            return [r.id for r in store.query(ListQuery(kind="session", **fields))]

        two = frozenset({"a", "c"})
        assert ids(namespaces=two) == ["026", "025", "023", "022", "020"]
        assert ids(namespaces=two, state="active") == ["026", "022", "020"]
        assert ids(namespaces=two, state="active", limit=2) == ["026", "022"]
        assert ids(namespaces=two, state="active", before_id="022") == ["020"]
        assert ids(namespaces=two, attrs={"project": "q"}, labels={"team": "x"}) == ["026"]
        assert ids(attrs={"empty": ""}, limit=3) == ["027", "026", "025"]
        assert ids(namespaces=frozenset({"b"}), labels={"team": "x"}) == ["021"]
        assert ids(state="nothing") == []
        moved = store.get("session", "021")
        assert moved is not None
        moved.namespace, moved.state, moved.labels = "c", "active", {"team": "z"}
        store.update(moved)
        assert ids(namespaces=frozenset({"b"}), labels={"team": "x"}) == []
        assert ids(namespaces=two, state="active", labels={"team": "z"}) == ["021"]
        assert ids(labels={"team": "x"}) == ["026"]
        store.delete("session", "026")
        assert ids(labels={"team": "x"}) == []
        assert ids(namespaces=two, state="active") == ["022", "021", "020"]

    def test_lists_by_name_page_from_a_cursor(self, store: Store) -> None:
        for i, (namespace, name) in enumerate(
            [("b", "n2"), ("a", "n3"), ("b", "n1"), ("c", "n0"), ("a", "n1")]
        ):
            store.insert(
                record(kind="actor", id=f"03{i}", namespace=namespace, name=name, labels={"odd": str(i % 2)})
            )
        store.insert(record(kind="actor", id="039", namespace="a"))  # unnamed: not listed by name

        def names(**fields: Any) -> list[tuple[str, str | None]]:
            return [
                (r.namespace, r.name) for r in store.query(ListQuery(kind="actor", by_name=True, **fields))
            ]

        assert names() == [("a", "n1"), ("a", "n3"), ("b", "n1"), ("b", "n2"), ("c", "n0")]
        assert names(after_name=("a", "n3"), limit=2) == [("b", "n1"), ("b", "n2")]
        assert names(namespaces=frozenset({"a", "c"}), after_name=("a", "n1")) == [("a", "n3"), ("c", "n0")]
        assert names(namespaces=frozenset({"b"}), after_name=("b", "n1")) == [("b", "n2")]
        assert names(namespaces=frozenset({"a"}), after_name=("b", "n0")) == []
        assert names(labels={"odd": "1"}) == [("a", "n3"), ("c", "n0")]
        assert names(namespaces=frozenset({"a", "b"}), labels={"odd": "0"}, after_name=("a", "n1")) == [
            ("b", "n1"),
            ("b", "n2"),
        ]

    def test_iter_kind(self, store: Store) -> None:
        store.insert(record(id="01B", namespace="x"))
        store.insert(record(id="01A", namespace="y"))
        store.insert(record(kind="plan", id="01C"))
        assert [r.id for r in store.iter_kind("session")] == ["01A", "01B"]
        assert [r.id for r in store.iter_kind("session", "x")] == ["01B"]
        assert list(store.iter_kind("actor")) == []

    # transactions ---------------------------------------------------------------------

    def test_transaction_rolls_back_everything(self, store: Store) -> None:
        def writes() -> None:
            store.insert(record(id="01A"))
            with store.transaction():
                store.insert(record(id="01B"))
                store.append_events([event()])

        fails_in_transaction(store, writes)
        assert store.get("session", "01A") is None
        assert store.get("session", "01B") is None
        assert store.last_sequence() == 0
        with store.transaction():
            store.insert(record(id="01A"))
        assert store.get("session", "01A") is not None

    def test_failed_write_inside_transaction_keeps_earlier_ones_out(self, store: Store) -> None:
        store.insert(record(id="01A", name="alpha"))

        def writes() -> None:
            with store.transaction():
                store.insert(record(id="01B", name="beta"))
                store.insert(record(id="01C", name="alpha"))

        with pytest.raises(StoreConflictError):
            writes()
        assert store.get("session", "01B") is None

    def test_after_commit_runs_on_commit_only(self, store: Store) -> None:
        calls: list[str] = []
        store.after_commit(lambda: calls.append("now"))
        assert calls == ["now"]
        with store.transaction():
            store.after_commit(lambda: calls.append("outer"))
            with store.transaction():
                store.after_commit(lambda: calls.append("inner"))
            assert calls == ["now"]
        assert calls == ["now", "outer", "inner"]
        fails_in_transaction(store, lambda: store.after_commit(lambda: calls.append("rolled back")))
        assert calls == ["now", "outer", "inner"]

    def test_failing_after_commit_callback_keeps_the_write(
        self, store: Store, caplog: pytest.LogCaptureFixture
    ) -> None:
        def boom() -> None:
            raise RuntimeError("callback failed")

        calls: list[int] = []
        with store.transaction():
            store.insert(record(id="01A"))
            store.after_commit(boom)
            store.after_commit(lambda: calls.append(1))
        assert store.get("session", "01A") is not None
        assert calls == [1]
        assert "after-commit callback" in caplog.text

    # items ----------------------------------------------------------------------------

    def test_items_are_ordered_per_owner(self, store: Store) -> None:
        assert store.append_items("messages", "s1", [b"a", b"b"]) == [0, 1]
        assert store.append_items("messages", "s2", [b"x"]) == [0]
        assert store.append_items("messages", "s1", [b"c"]) == [2]
        assert store.append_items("messages", "s1", []) == []
        assert store.list_items("messages", "s1") == [(0, b"a"), (1, b"b"), (2, b"c")]
        assert store.list_items("other", "s1") == []
        store.delete_items("messages", "s1")
        assert store.list_items("messages", "s1") == []
        assert store.list_items("messages", "s2") == [(0, b"x")]

    def test_put_items_replaces_only_the_given_rows(self, store: Store) -> None:
        store.append_items("steps", "p1", [b"a", b"b", b"c"])
        store.append_items("steps", "p2", [b"x"])
        store.put_items("steps", "p1", {1: b"B"})
        assert store.list_items("steps", "p1") == [(0, b"a"), (1, b"B"), (2, b"c")]
        store.put_items("steps", "p1", {0: b"A", 3: b"d"})
        assert store.list_items("steps", "p1") == [(0, b"A"), (1, b"B"), (2, b"c"), (3, b"d")]
        assert store.append_items("steps", "p1", [b"e"]) == [4]
        assert store.list_items("steps", "p2") == [(0, b"x")]
        fails_in_transaction(store, lambda: store.put_items("steps", "p2", {0: b"y"}))
        assert store.list_items("steps", "p2") == [(0, b"x")]

    # events ---------------------------------------------------------------------------

    def test_event_sequences_are_global_and_gap_free(self, store: Store) -> None:
        assert (store.first_sequence(), store.last_sequence()) == (0, 0)
        assert store.read_events(0, 10) == []
        assert store.append_events([event(), event()]) == [1, 2]
        assert store.append_events([]) == []
        assert store.append_events([event(namespace="x")]) == [3]
        read = store.read_events(0, 10)
        assert [e.sequence for e in read] == [1, 2, 3]
        assert read[2].namespace == "x"
        assert read[2].body == b"x/plan.created//"
        assert [e.sequence for e in store.read_events(1, 1)] == [2]
        assert (store.first_sequence(), store.last_sequence()) == (1, 3)

    def test_rolled_back_events_leave_no_gap(self, store: Store) -> None:
        store.append_events([event()])
        assigned: list[int] = []
        fails_in_transaction(store, lambda: assigned.extend(store.append_events([event(), event()])))
        assert assigned == [2, 3]
        assert store.append_events([event()]) == [2]

    def test_read_events_filters(self, store: Store) -> None:
        store.append_events(
            [
                event("a", "plan.created", plan_id="p1"),
                event("a", "tool.invoked", plan_id="p1", session_id="s1"),
                event("b", "tool.invoked", plan_id="p2"),
                event("b", "session.message", session_id="s1"),
                event("c", "plan.error", plan_id="p1"),
            ]
        )

        def seqs(where: EventFilter, after: int = 0) -> list[int]:
            found = store.read_events(after, 100, where)
            # read_event_bodies: the same rows, their sequences and bodies alone.
            assert store.read_event_bodies(after, 100, where) == [(e.sequence, e.body) for e in found]
            return [e.sequence for e in found]

        assert seqs(EventFilter()) == [1, 2, 3, 4, 5]
        assert seqs(EventFilter(namespaces=frozenset({"a", "c"}))) == [1, 2, 5]
        assert seqs(EventFilter(namespaces=frozenset())) == []
        assert seqs(EventFilter(plan_id="p1")) == [1, 2, 5]
        assert seqs(EventFilter(session_id="s1")) == [2, 4]
        assert seqs(EventFilter(types=frozenset({"tool.invoked", "plan.error"}))) == [2, 3, 5]
        assert seqs(EventFilter(plan_id="p1", types=frozenset({"tool.invoked"}))) == [2]
        assert seqs(EventFilter(plan_id="p1"), after=2) == [5]
        assert [e.sequence for e in store.read_events(0, 2, EventFilter(plan_id="p1"))] == [1, 2]
        for stored in store.read_events(0, 100):
            assert EventFilter(plan_id="p1").matches(
                stored.namespace, stored.type, stored.plan_id, stored.session_id
            ) == (stored.plan_id == "p1")

    def test_prune_by_count_keeps_the_newest(self, store: Store) -> None:
        store.append_events([event() for _ in range(10)])
        assert store.prune_events(keep_last=4) == 6
        assert (store.first_sequence(), store.last_sequence()) == (7, 10)
        assert store.prune_events(keep_last=4) == 0
        assert store.prune_events(keep_last=0) == 3
        assert (store.first_sequence(), store.last_sequence()) == (10, 10)
        assert store.append_events([event()]) == [11]

    def test_prune_by_age_keeps_the_newest(self, store: Store) -> None:
        old = time.time() - 3600
        store.append_events([event(when=old) for _ in range(3)])
        store.append_events([event()])
        assert store.prune_events(older_than=time.time() - 60) == 3
        assert [e.sequence for e in store.read_events(0, 10)] == [4]
        store.append_events([event(when=old)])
        # Even an old newest event stays, so the sequence never restarts.
        assert store.prune_events(older_than=time.time()) == 1
        assert [e.sequence for e in store.read_events(0, 10)] == [5]
        assert store.append_events([event()]) == [6]
        assert store.prune_events() == 0

    # the event loop's interface --------------------------------------------------------

    async def test_write_commits_and_answers_what_the_function_returned(self, store: Store) -> None:
        def insert(s: Store) -> str:
            s.insert(record(id="01A", name="alpha"))
            return "done"

        assert await store.write(insert) == "done"
        got = await store.read(lambda s: s.get("session", "01A"))
        assert got is not None
        assert got.name == "alpha"
        assert store.get("session", "01A") == got

    async def test_a_failing_write_undoes_only_itself(self, store: Store) -> None:
        """Writes queued together commit together, but each succeeds or fails alone."""

        def insert(id: str, name: str, fail: bool = False) -> Callable[[Store], None]:
            def write(s: Store) -> None:
                s.insert(record(id=id, name=name))
                s.append_items("messages", id, [b"m"])
                if fail:
                    raise RuntimeError("abort")

            return write

        results = await asyncio.gather(
            store.write(insert("01A", "a")),
            store.write(insert("01B", "b", fail=True)),
            store.write(insert("01C", "a")),
            store.write(insert("01D", "d")),
            return_exceptions=True,
        )
        assert results[0] is None
        assert results[3] is None
        assert isinstance(results[1], RuntimeError)
        assert isinstance(results[2], StoreConflictError)
        assert [r.id for r in store.iter_kind("session")] == ["01A", "01D"]
        assert store.list_items("messages", "01B") == []
        assert store.list_items("messages", "01C") == []

    async def test_concurrent_writes_are_acknowledged_after_their_callbacks_in_sequence_order(
        self, store: Store
    ) -> None:
        delivered: list[int] = []

        def append(s: Store) -> int:
            (sequence,) = s.append_events([event()])
            s.after_commit(lambda: delivered.append(sequence))
            return sequence

        async def one() -> int:
            sequence = await store.write(append)
            assert sequence in delivered
            return sequence

        sequences = await asyncio.gather(*(one() for _ in range(50)))
        assert sorted(sequences) == list(range(1, 51))
        assert delivered == list(range(1, 51))
        assert [e.sequence for e in store.read_events(0, 100)] == list(range(1, 51))

    async def test_a_read_sees_one_snapshot(self, store: Store) -> None:
        """A write committed while a read runs is not half-seen by it."""
        store.insert(record(id="01A", state="active"))
        first_read = threading.Event()
        written = threading.Event()

        def read(s: Store) -> tuple[str, str, list[tuple[int, bytes]]]:
            before = s.get("session", "01A")
            first_read.set()
            assert written.wait(10)
            after, items = s.get_with_items("session", "01A", "messages")
            assert before is not None
            assert after is not None
            return before.state, after.state, items

        def write(s: Store) -> None:
            s.update(record(id="01A", state="closed", revision=2))
            s.append_items("messages", "01A", [b"m"])

        reading = asyncio.ensure_future(store.read(read))
        assert await asyncio.to_thread(first_read.wait, 10)
        await store.write(write)
        written.set()
        assert await reading == ("active", "active", [])
        assert (await store.read(lambda s: s.list_items("messages", "01A"))) == [(0, b"m")]

    async def test_get_with_items_answers_what_get_and_list_items_do(self, store: Store) -> None:
        """In a read (first statement or later), in a write and outside both; a missing owner
        has no record and no items."""
        store.insert(record(id="01A", state="active"))
        store.append_items("messages", "01A", [b"a", b"b"])
        store.append_items("steps", "01A", [b"x"])
        expected = (store.get("session", "01A"), [(0, b"a"), (1, b"b")])
        assert expected[0] is not None
        assert store.get_with_items("session", "01A", "messages") == expected
        assert await store.read(lambda s: s.get_with_items("session", "01A", "messages")) == expected
        assert await store.read(
            lambda s: (s.get("session", "01B"), s.get_with_items("session", "01A", "messages"))
        ) == (
            None,
            expected,
        )
        assert await store.write(lambda s: s.get_with_items("session", "01A", "messages")) == expected
        assert await store.read(lambda s: s.get_with_items("session", "01B", "messages")) == (None, [])
        assert await store.read(lambda s: s.get_with_items("plan", "01A", "steps")) == (None, [(0, b"x")])

    async def test_the_loop_reads_answer_what_a_read_of_the_same_call_does(self, store: Store) -> None:
        """``read_get``, ``read_with_items``, ``read_query`` and ``read_items`` (which a store
        may answer without a thread): the answers of ``read`` calling the method they name,
        NUL-free or not found alike."""
        store.insert(record(id="01A", name="n01A", state="active", attrs={"orchestrator": "o"}))
        store.insert(record(id="01B", namespace="other", name="n01B"))
        store.append_items("messages", "01A", [b"a", b"b"])
        queries = [
            ListQuery("session", None, limit=10),
            ListQuery(
                "session", frozenset({"default"}), state="active", attrs={"orchestrator": "o"}, limit=10
            ),
            ListQuery("session", frozenset(), limit=10),
            ListQuery("session", None, before_id="01B", limit=1),
        ]

        def read(fn: Callable[[Store], Any]) -> Any:
            return store.read(fn)

        for _ in range(2):  # the first and a prepared run
            for id in ("01A", "01B", "01C"):
                assert await store.read_get("session", id) == await read(functools.partial(_get, id=id))
                assert await store.read_get_by_name("session", "default", f"n{id}") == await read(
                    functools.partial(_by_name, name=f"n{id}")
                )
                assert await store.read_with_items("session", id, "messages") == await read(
                    functools.partial(_with_items, id=id)
                )
                assert await store.read_items("messages", id) == await read(functools.partial(_items, id=id))
            for query in queries:
                assert await store.read_query(query) == await read(functools.partial(_query, query=query))
        found, items = await store.read_with_items("session", "01A", "messages")
        assert found is not None
        assert (found.state, items) == ("active", [(0, b"a"), (1, b"b")])

    async def test_point_reads_asked_for_at_once_answer_as_each_alone(self, store: Store) -> None:
        """Many ``read_get`` and ``read_with_items`` calls in one turn of the loop (which a
        store may answer in one statement): each caller gets what it asked for, whatever the
        kind, the values, a record asked for twice or one that is not there."""
        store.insert(record(id="01A", name="ñame ✓", labels={"k": "v w"}, attrs={"a": "b"}, body=b""))
        store.insert(record(kind="plan", id="01A", namespace="other", body=bytes(range(256))))
        store.insert(record(id="01B", create_time=1764612345.1234567, update_time=0.1 + 0.2, revision=7))
        store.append_items("messages", "01A", [b"a", b"\x00b"])
        store.put_items("steps", "01A", {5: b"five", 2: b"two", 11: b"eleven"})
        asked = [
            ("session", "01A", "messages"),
            ("plan", "01A", "steps"),
            ("session", "01B", "messages"),
            ("session", "01Z", "messages"),
            ("session", "01A", "steps"),
            ("session", "01A", "messages"),
            ("plan", "01A", None),
            ("session", "01B", None),
            ("session", "01Z", None),
        ]

        def ask(kind: str, id: str, collection: str | None) -> Awaitable[Any]:
            if collection is None:
                return store.read_get(kind, id)
            return store.read_with_items(kind, id, collection)

        together = await asyncio.gather(*(ask(*args) for args in asked * 3))
        alone = [await ask(*args) for args in asked]
        assert together == alone * 3
        expected = {
            ("session", "01A", "messages"): (store.get("session", "01A"), [(0, b"a"), (1, b"\x00b")]),
            ("plan", "01A", "steps"): (
                store.get("plan", "01A"),
                [(2, b"two"), (5, b"five"), (11, b"eleven")],
            ),
            ("session", "01A", None): store.get("session", "01A"),
        }
        for args, answer in zip(asked, alone, strict=True):
            if args[1] == "01Z":
                assert answer in (None, (None, []))
            elif args in expected:
                assert answer == expected[args]
        late = await store.read_get("session", "01B")
        assert late is not None
        assert (late.create_time, late.update_time, late.revision) == (1764612345.1234567, 0.1 + 0.2, 7)

    async def test_insert_alone_is_an_insert_in_a_write_of_its_own(self, store: Store) -> None:
        """``insert_alone`` (which a store may commit without its writer thread): the record
        as ``insert`` stores it, readable at once; an id or name taken is StoreConflictError
        and writes nothing; many at once each land."""
        await store.insert_alone(record(id="01A", name="n", labels={"k": "v"}, attrs={"a": "b"}))
        await store.write(lambda s: s.insert(record(id="01B", name="m")))
        found = await store.read_get("session", "01A")
        assert found is not None
        assert (found.name, found.labels, found.attrs) == ("n", {"k": "v"}, {"a": "b"})
        assert found.body == b"body-01A"
        for clash in (record(id="01A"), record(id="01C", name="n")):
            with pytest.raises(StoreConflictError):
                await store.insert_alone(clash)
        assert await store.read_get("session", "01C") is None
        await asyncio.gather(*(store.insert_alone(record(id=f"01M{index:02}")) for index in range(40)))
        page = await store.read_query(ListQuery("session", None, limit=100))
        assert len(page) == 42

    async def test_inserts_asked_for_at_once_each_meet_only_their_own_fault(self, store: Store) -> None:
        """Many ``insert_alone`` calls in one turn of the loop (which a store may make in a
        few statements together): each lands, or fails, as it would alone. An id or name
        taken (before, or by another of them) is StoreConflictError; under a request id each
        stamps its own row, and one whose id another live run holds writes nothing."""
        store.insert(record(id="01T", name="taken"))
        assert store.stamp_request(request_entry(owner="other", request_id="held"), cutoff=0.0)
        claims = {
            "01C": Claim(request_entry(request_id="mine"), cutoff=0.0),
            "01X": Claim(request_entry(request_id="held"), cutoff=0.0),
        }

        async def insert(new: Record) -> None:
            CLAIM.set(claims.get(new.id))  # in this task's own context
            await store.insert_alone(new)

        asked = [
            record(id="01A", state="active", attrs={"orchestrator": "o", "project": ""}, labels={"k": "v"}),
            record(id="01T"),
            record(id="01B", state="active", labels={"k": "v", "x": ""}),
            record(id="01N", name="taken"),
            record(id="01D", name="d1"),
            record(id="01D", name="d2"),
            record(id="01C", state="active", body=b"claimed"),
            record(id="01X"),
            record(id="01E", labels={"k": "v"}),
        ]

        async def failures() -> dict[str, type[BaseException]]:
            outcomes = await asyncio.gather(*(insert(new) for new in asked), return_exceptions=True)
            return {new.id: type(outcome) for new, outcome in zip(asked, outcomes, strict=True) if outcome}

        assert await failures() == {
            "01T": StoreConflictError,
            "01N": StoreConflictError,
            "01D": StoreConflictError,
            "01X": RequestClaimedError,
        }
        # Again: every id is taken now, and 01X's request id is still another run's.
        again = await failures()
        assert again.pop("01X") is RequestClaimedError
        assert again == dict.fromkeys(("01A", "01T", "01B", "01N", "01D", "01C", "01E"), StoreConflictError)
        assert store.get("session", "01X") is None
        assert store.get("session", "01N") is None
        first_d = store.get("session", "01D")
        assert first_d is not None
        assert first_d.name in ("d1", "d2")
        labelled = await store.read_query(ListQuery("session", None, labels={"k": "v"}))
        assert [found.id for found in labelled] == ["01E", "01B", "01A"]
        assert [
            found.id for found in await store.read_query(ListQuery("session", None, labels={"x": ""}))
        ] == ["01B"]
        by_attr = await store.read_query(ListQuery("session", None, attrs={"orchestrator": "o"}))
        assert [found.id for found in by_attr] == ["01A"]
        active = await store.read_query(ListQuery("session", None, state="active"))
        assert [found.id for found in active] == ["01C", "01B", "01A"]
        stamped = store.get_request("alice", "mine")
        assert stamped is not None
        assert (stamped.owner, stamped.written) == ("owner-1", {("session", "01C"): b"claimed"})
        held = store.get_request("alice", "held")
        assert held is not None
        assert held.owner == "other"

    async def test_reads_do_not_wait_for_a_write(self, store: Store) -> None:
        store.insert(record(id="01A"))
        inside = threading.Event()
        release = threading.Event()

        def slow(s: Store) -> None:
            s.insert(record(id="01B"))
            inside.set()
            assert release.wait(10)

        writing = asyncio.ensure_future(store.write(slow))
        try:
            assert await asyncio.to_thread(inside.wait, 10)
            assert await asyncio.wait_for(store.read(lambda s: s.get("session", "01A")), 10) is not None
            assert await store.read(lambda s: s.get("session", "01B")) is None
        finally:
            release.set()
        await writing
        assert await store.read(lambda s: s.get("session", "01B")) is not None

    async def test_closing_waits_for_a_running_write_without_holding_the_loop(self, store: Store) -> None:
        """``aclose`` while a write runs: the loop goes on (a task of it runs) before the
        write may finish; then the close commits and answers it. A close that waited on the
        loop would let the write go only after the helper's safety bound: the loop's turn
        would come after the release, and the test fails instead of hanging."""
        inside = threading.Event()
        release = threading.Event()
        loop_ran_first: list[bool] = []

        def slow(s: Store) -> str:
            s.insert(record(id="01B"))
            inside.set()
            assert release.wait(30)
            return "written"

        async def on_the_loop() -> None:
            loop_ran_first.append(not release.is_set())
            release.set()

        def release_later() -> None:
            # Only a safety bound, shorter than the write's: the loop's task releases it.
            release.wait(20)
            release.set()

        writing = asyncio.ensure_future(store.write(slow))
        assert await asyncio.to_thread(inside.wait, 10)
        helper = threading.Thread(target=release_later, daemon=True)
        helper.start()
        closing = asyncio.ensure_future(store.aclose())
        await asyncio.sleep(0)
        await on_the_loop()
        await closing
        helper.join()
        assert loop_ran_first == [True]
        assert await writing == "written"
        with pytest.raises(RuntimeError, match="closed"):
            await store.write(lambda s: None)

    async def test_the_observer_hears_every_read_write_and_commit(self, store: Store) -> None:
        heard: list[tuple[str, float]] = []

        class Recorder:
            def committed(self, seconds: float) -> None:
                heard.append(("commit", seconds))

            def waited(self, access: str, seconds: float) -> None:
                heard.append((access, seconds))

        store.observe(Recorder())

        def insert(id: str) -> Callable[[Store], None]:
            return lambda s: s.insert(record(id=id))

        # One call after another: each write is its own commit.
        for index in range(3):
            await store.write(insert(f"01{index}"))
        for _ in range(2):
            await store.read(lambda s: s.get("session", "010"))
        store.observe(None)
        await store.read(lambda s: s.last_sequence())
        assert [kind for kind, _ in heard] == ["write", "commit"] * 3 + ["read", "read"]
        assert all(seconds >= 0 for _, seconds in heard)

    # leases ---------------------------------------------------------------------------

    def test_a_lease_is_claimed_once_and_fences_by_token(self, store: Store) -> None:
        first = store.claim_lease("plan:01A", "one", 30)
        assert first is not None
        assert (first.owner, first.token, first.live) == ("one", 1, True)
        assert first.expires > store.store_time()
        assert store.claim_lease("plan:01A", "two", 30) is None
        with store.transaction():
            assert store.check_lease("plan:01A", 1) == store.get_lease("plan:01A")
        with pytest.raises(LeaseLostError), store.transaction():
            store.check_lease("plan:01A", 2)
        # A write that holds no lease is refused while someone holds it.
        with pytest.raises(LeaseHeldError) as held, store.transaction():
            store.check_lease("plan:01A", None)
        assert held.value.lease.token == 1
        with store.transaction():
            never = store.check_lease("plan:never", None)
        assert never is None or (never.owner, never.token) == ("", 0)

    def test_release_keeps_the_token_growing(self, store: Store) -> None:
        first = store.claim_lease("plan:01A", "one", 30)
        assert first is not None
        assert store.release_lease("plan:01A", 7) is False
        assert store.release_lease("plan:01A", first.token) is True
        assert store.release_lease("plan:01A", first.token) is False
        released = store.get_lease("plan:01A")
        assert released is not None
        assert (released.owner, released.live, released.token) == ("", False, 1)
        with store.transaction():
            store.check_lease("plan:01A", None)
        with pytest.raises(LeaseLostError), store.transaction():
            store.check_lease("plan:01A", 1)
        second = store.claim_lease("plan:01A", "two", 30)
        assert second is not None
        assert (second.owner, second.token) == ("two", 2)

    def test_an_expired_lease_refuses_its_holder_and_can_be_claimed(self, store: Store) -> None:
        assert store.claim_lease("plan:01A", "one", 0.05) is not None
        expired = _wait_for_expiry(store, "plan:01A")
        assert (expired.owner, expired.token) == ("one", 1)
        # The holder's writes are refused even before anyone else claims it.
        with pytest.raises(LeaseLostError), store.transaction():
            store.check_lease("plan:01A", 1)
        taken = store.claim_lease("plan:01A", "two", 30)
        assert taken is not None
        assert taken.token == 2
        # The old holder cannot renew or release what it lost.
        assert store.renew_leases("one", {"plan:01A": 1}, 30) == {}
        assert store.release_lease("plan:01A", 1) is False
        assert store.renew_leases("two", {"plan:01A": 2}, 30) == {"plan:01A": ""}

    def test_renewing_an_expired_lease_nobody_took_revives_it(self, store: Store) -> None:
        assert store.claim_lease("plan:01A", "one", 0.05) is not None
        _wait_for_expiry(store, "plan:01A")
        assert store.renew_leases("one", {"plan:01A": 1}, 30) == {"plan:01A": ""}
        with store.transaction():
            store.check_lease("plan:01A", 1)
        assert store.claim_lease("plan:01A", "two", 30) is None

    def test_a_dead_holders_lease_is_taken_by_its_token(self, store: Store) -> None:
        assert store.claim_lease("plan:01A", "one", 30) is not None
        assert store.claim_lease("plan:01A", "two", 30, steal_token=5) is None
        stolen = store.claim_lease("plan:01A", "two", 30, steal_token=1)
        assert stolen is not None
        assert (stolen.owner, stolen.token) == ("two", 2)
        # A second taker with the same stale token finds it gone.
        assert store.claim_lease("plan:01A", "three", 30, steal_token=1) is None

    def test_a_request_reaches_the_holder_and_a_new_claim_clears_it(self, store: Store) -> None:
        assert store.request_lease("plan:01A", "cancel") is False
        assert store.claim_lease("plan:01A", "one", 30) is not None
        assert store.request_lease("plan:01A", "cancel") is True
        assert store.renew_leases("one", {"plan:01A": 1}, 30) == {"plan:01A": "cancel"}
        lease = store.get_lease("plan:01A")
        assert lease is not None
        assert lease.request == "cancel"
        assert store.release_lease("plan:01A", 1)
        claimed = store.claim_lease("plan:01A", "two", 30)
        assert claimed is not None
        assert claimed.request == ""

    def test_held_leases_by_prefix_soonest_first(self, store: Store) -> None:
        assert store.claim_lease("plan:01B", "one", 60) is not None
        assert store.claim_lease("plan:01A", "one", 30) is not None
        assert store.claim_lease("other:01C", "one", 30) is not None
        assert store.claim_lease("plan:01D", "one", 30) is not None
        assert store.release_lease("plan:01D", 1)
        assert [lease.name for lease in store.held_leases("plan:", 10)] == ["plan:01A", "plan:01B"]
        assert [lease.name for lease in store.held_leases("plan:", 1)] == ["plan:01A"]
        assert store.held_leases("plan_", 10) == []

    def test_a_refused_fence_rolls_back_the_guarded_writes(self, store: Store) -> None:
        assert store.claim_lease("plan:01A", "one", 30) is not None

        def guarded() -> None:
            with store.transaction():
                store.insert(record(id="01X"))
                store.append_events([event(plan_id="01A")])
                store.check_lease("plan:01A", 2)

        with pytest.raises(LeaseLostError):
            guarded()
        assert store.get("session", "01X") is None
        assert store.last_sequence() == 0

    async def test_concurrent_claims_have_one_winner(self, store: Store) -> None:
        def claim(owner: str) -> Callable[[Store], Lease | None]:
            return lambda s: s.claim_lease("plan:01A", owner, 30)

        won = await asyncio.gather(*(store.write(claim(f"owner{i}")) for i in range(16)))
        winners = [lease for lease in won if lease is not None]
        assert len(winners) == 1
        assert winners[0].token == 1

    def test_the_store_clock_moves_forward(self, store: Store) -> None:
        first = store.store_time()
        time.sleep(0.01)
        assert store.store_time() > first

    # durability and misuse ------------------------------------------------------------

    def test_reopen_keeps_everything(self, open_store: Callable[[], Store]) -> None:
        """What one store wrote, the next one on the same database reads."""
        first = open_store()
        first.insert(record(id="01A", name="alpha"))
        first.append_items("messages", "01A", [b"m0", b"m1"])
        first.append_events([event(), event()])
        first.prune_events(keep_last=1)
        first.close()
        second = open_store()
        assert second.get("session", "01A") is not None
        assert second.list_items("messages", "01A") == [(0, b"m0"), (1, b"m1")]
        assert second.append_events([event()]) == [3]

    async def test_other_tasks_cannot_join_a_transaction_held_across_an_await(self, store: Store) -> None:
        inside, release = asyncio.Event(), asyncio.Event()

        async def holder() -> None:
            with store.transaction():
                store.insert(record(id="01A"))
                inside.set()
                await release.wait()

        task = asyncio.create_task(holder())
        try:
            await asyncio.wait_for(inside.wait(), 10)
            misuses: list[Callable[[], object]] = [
                lambda: store.get("session", "01A"),
                lambda: store.insert(record(id="01B")),
                lambda: store.after_commit(lambda: None),
            ]
            for misuse in misuses:
                with pytest.raises(RuntimeError, match="across an await"):
                    misuse()
            release.set()
            await asyncio.wait_for(task, 10)
            assert store.get("session", "01A") is not None
            assert store.get("session", "01B") is None
        finally:
            release.set()


def _get(s: Store, id: str) -> Record | None:
    return s.get("session", id)


def _by_name(s: Store, name: str) -> Record | None:
    return s.get_by_name("session", "default", name)


def _with_items(s: Store, id: str) -> tuple[Record | None, list[tuple[int, bytes]]]:
    return s.get_with_items("session", id, "messages")


def _items(s: Store, id: str) -> list[tuple[int, bytes]]:
    return s.list_items("messages", id)


def _query(s: Store, query: ListQuery) -> list[Record]:
    return s.query(query)


def _wait_for_expiry(store: Store, name: str) -> Lease:
    """Until the lease has expired by the store's own clock (a bounded wait)."""
    deadline = time.monotonic() + 10
    while True:
        lease = store.get_lease(name)
        assert lease is not None
        if not lease.live:
            return lease
        assert time.monotonic() < deadline, "the lease never expired"
        time.sleep(0.02)
