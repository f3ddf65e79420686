"""Issue 17, finding 9 (sizes and counts): labels (how many, key and value sizes) and
identifiers (names, namespaces, ids, references) are bounded once, in the facade, so every
transport refuses the same request with the same INVALID_PARAMS naming the field."""

from __future__ import annotations

import asyncio
import pathlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
from google.protobuf import json_format

from cleveragents.acp.contract import limits
from cleveragents.acp.contract.errors import ACPError
from tests.conformance.backends import KINDS, open_backend
from tests.server_process import Tokens

TOO_MANY = {f"k{index}": "v" for index in range(limits.MAX_MAP_ENTRIES + 1)}
LONG = "n" * (limits.MAX_NAME_CHARS + 1)

# (operation, params, the refused field, its details beyond "field")
REFUSED: list[tuple[str, dict[str, Any], str, dict[str, int]]] = [
    ("session.create", {"labels": TOO_MANY}, "labels", {"max_entries": limits.MAX_MAP_ENTRIES}),
    ("actor.list", {"labels": TOO_MANY}, "labels", {"max_entries": limits.MAX_MAP_ENTRIES}),
    (
        "resource.add",
        {"name": "r", "labels": {"k": "v" * (limits.MAX_MAP_VALUE_CHARS + 1)}, "spec": {"type": "x"}},
        "labels.k",
        {"max_chars": limits.MAX_MAP_VALUE_CHARS},
    ),
    ("resource.add", {"name": LONG, "spec": {"type": "x"}}, "name", {"max_chars": limits.MAX_NAME_CHARS}),
    ("plan.status", {"plan_id": LONG}, "plan_id", {"max_chars": limits.MAX_NAME_CHARS}),
    ("session.list", {"namespace": LONG}, "namespace", {"max_chars": limits.MAX_NAME_CHARS}),
    (
        "action.add",
        {"name": "a", "spec": {"actor": "scripted", "skills": ["s", LONG]}},
        "spec.skills[1]",
        {"max_chars": limits.MAX_NAME_CHARS},
    ),
]


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Tokens:
    return Tokens.create(tmp_path_factory.mktemp("bounds-tokens"))


def in_own_loop(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Runs ``body`` on a fresh loop in a thread: tests/security runs after the browser tests,
    whose session-wide Playwright keeps a loop running in the main thread."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(body())
        except BaseException as exc:  # re-raised in the test's thread
            failures.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "the test's loop did not finish in 120 s"
    if failures:
        raise failures[0]


@pytest.mark.parametrize("kind", KINDS)
def test_labels_and_identifiers_are_bounded_on_every_transport(
    kind: str, tmp_path: pathlib.Path, tokens: Tokens
) -> None:
    in_own_loop(lambda: _bounded_everywhere(kind, tmp_path, tokens))


async def _bounded_everywhere(kind: str, tmp_path: pathlib.Path, tokens: Tokens) -> None:
    async with open_backend(kind, tmp_path, tokens) as backend:
        alice = backend.client("root")
        for operation, params, field, details in REFUSED:
            with pytest.raises(ACPError) as refused:
                await alice.call(operation, params)
            assert refused.value.code == "INVALID_PARAMS", (operation, refused.value)
            assert refused.value.details == {"field": field, **details}, (operation, refused.value)
        # An imported document's session labels are held to the same count.
        session_id = (await alice.call("session.create")).session.meta.id  # type: ignore[attr-defined]
        exported = await alice.call("session.export", session_id=session_id)
        document = json_format.MessageToDict(exported.document)  # type: ignore[attr-defined]
        document["session"]["labels"] = TOO_MANY
        with pytest.raises(ACPError) as refused:
            await alice.call("session.import", {"document": document, "new_id": True})
        assert refused.value.code == "INVALID_PARAMS"
        assert refused.value.details["path"] == "$.session.labels"
        # At the bound itself, accepted.
        at_bound = {f"k{index}": "v" for index in range(limits.MAX_MAP_ENTRIES)}
        created = await alice.call("session.create", {"labels": at_bound})
        assert len(created.session.labels) == limits.MAX_MAP_ENTRIES  # type: ignore[attr-defined]
