"""How many tests the suite has, counted from pytest's own collection, so docs/testing.md
reports test functions and parametrized cases separately with numbers that are current.

``python -m tests.collection_counts`` prints the block; ``--write`` replaces it in
docs/testing.md (between the markers). ``tests/test_testing_doc.py`` fails when the doc's
block differs from what ``make test`` collects.

Also a pytest plugin (``tests/conftest.py`` loads it): a session that collects the whole suite
(the testpaths, nothing chosen by ``-k``/``-m``, ignored or deselected) keeps its node ids, so
the doc test reads them instead of collecting the suite again in a subprocess (about 14 s of
``make test``); any narrower session still collects afresh.
"""

from __future__ import annotations

import collections
import pathlib
import subprocess
import sys
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "testing.md"
BEGIN = "<!-- counts: python -m tests.collection_counts --write -->"
END = "<!-- /counts -->"
# The largest parametrizations named in the doc.
LARGEST = 5
COLLECT_TIMEOUT = 600


# The node ids of a session that collected the whole suite; whether anything was deselected.
_WHOLE_SUITE = pytest.StashKey[list[str]]()
_DESELECTED = pytest.StashKey[bool]()


def _collects_whole_suite(config: pytest.Config) -> bool:
    """Whether the session's collection is ``make test``'s: its testpaths, all of them."""
    option = config.option
    if option.keyword or option.markexpr or option.ignore or option.ignore_glob or option.deselect:
        return False
    if config.args_source is pytest.Config.ArgsSource.TESTPATHS:
        return True
    testpaths = {(config.rootpath / path).resolve() for path in config.getini("testpaths")}
    given = {(config.invocation_params.dir / arg).resolve() for arg in config.args}
    return given == testpaths


def pytest_deselected(items: list[pytest.Item]) -> None:
    if items:
        items[0].config.stash[_DESELECTED] = True


def pytest_collection_finish(session: pytest.Session) -> None:
    config = session.config
    if _collects_whole_suite(config) and not config.stash.get(_DESELECTED, False):
        config.stash[_WHOLE_SUITE] = [item.nodeid for item in session.items]


def collected(config: pytest.Config) -> list[str]:
    """The node ids ``make test`` collects: this session's when it collected the whole
    suite, else those of a fresh collection."""
    ids = config.stash.get(_WHOLE_SUITE, None)
    return ids if ids is not None else collect()


def collect() -> list[str]:
    """The node id of every item ``make test`` collects (its pytest, its testpaths)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-o", "addopts=", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=COLLECT_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


@dataclass(frozen=True)
class Counts:
    items: int
    functions: int
    parametrized: dict[str, int]

    @classmethod
    def of(cls, node_ids: list[str]) -> Counts:
        per_function = collections.Counter(node_id.split("[", 1)[0] for node_id in node_ids)
        # Cases show as ``function[id]``; schemathesis' show as the bare id, once per case.
        with_ids = {node_id.split("[", 1)[0] for node_id in node_ids if "[" in node_id}
        parametrized = {
            function: cases for function, cases in per_function.items() if function in with_ids or cases > 1
        }
        return cls(len(node_ids), len(per_function), parametrized)

    def block(self) -> str:
        plain = self.functions - len(self.parametrized)
        cases = sum(self.parametrized.values())
        largest = sorted(self.parametrized.items(), key=lambda pair: (-pair[1], pair[0]))[:LARGEST]
        lines = [
            BEGIN,
            f"`make test` collects {self.items:,} items from **{self.functions:,} test functions**: "
            f"{plain:,} plain functions (one item each) and {len(self.parametrized):,} parametrized "
            f"ones, which make {cases:,} items (a parametrized case is an item, not a test). "
            f"The {LARGEST} largest parametrizations:",
            "",
            "| cases | test function |",
            "| ---: | --- |",
            *(f"| {count} | `{function}` |" for function, count in largest),
            END,
        ]
        return "\n".join(lines)


def documented(text: str) -> str:
    """The generated block as the doc has it."""
    start, end = text.index(BEGIN), text.index(END)
    return text[start : end + len(END)]


def main(argv: list[str]) -> int:
    block = Counts.of(collect()).block()
    if argv[1:] == ["--write"]:
        text = DOC.read_text()
        DOC.write_text(text.replace(documented(text), block))
    else:
        print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
