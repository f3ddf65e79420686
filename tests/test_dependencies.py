"""Declared dependencies match what the code imports: every third-party module the package
imports comes from a distribution pyproject.toml names (``dependencies``), and every one
the tests and benchmarks import from one it names there or in the ``dev`` extra (the
package may also import what an optional extra adds, behind an ImportError guard). A module
that only arrives as another package's dependency (starlette under fastapi) would vanish
the day that package stops needing it."""

from __future__ import annotations

import ast
import importlib.metadata
import pathlib
import re
import sys
import tomllib
from collections.abc import Iterable

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PACKAGE_DIRS = ("contract", "facade", "gateway", "client")
DEV_DIRS = ("tests", "bench", "proto")
FIRST_PARTY = frozenset({"cleveragents", "tests", "bench"})


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _names(requirements: Iterable[str]) -> frozenset[str]:
    return frozenset(_normalized(re.split(r"[\s<>=!~;\[]", req, maxsplit=1)[0]) for req in requirements)


DECLARED = _names(PROJECT["dependencies"])
DECLARED_DEV = DECLARED | _names(PROJECT["optional-dependencies"]["dev"])
# The package may also import, behind an ImportError guard, what an optional extra (``otel``) adds.
DECLARED_WITH_EXTRAS = DECLARED | frozenset(
    name
    for extra, requirements in PROJECT["optional-dependencies"].items()
    if extra != "dev"
    for name in _names(requirements)
)


def imported_modules(dirs: Iterable[str]) -> dict[str, str]:
    """Every absolute import of the files under ``dirs``: module -> the first file naming it."""
    found: dict[str, str] = {}
    for folder in dirs:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if ".venv" in path.parts:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    found.setdefault(name, str(path.relative_to(ROOT)))
    return found


def _owners() -> dict[str, set[str]]:
    """Top-level module -> distributions, and for a namespace shared by several (``google``)
    also ``top.second`` -> distributions, from the installed distributions' file lists."""
    owners: dict[str, set[str]] = {}
    for dist in importlib.metadata.distributions():
        name = _normalized(dist.metadata["Name"])
        for file in dist.files or ():
            parts = pathlib.PurePosixPath(str(file)).parts
            if not parts or parts[0].endswith((".dist-info", ".data")) or parts[0] in ("..", "bin"):
                continue
            top = parts[0].removesuffix(".py")
            owners.setdefault(top, set()).add(name)
            if len(parts) > 2:
                owners.setdefault(f"{top}.{parts[1]}", set()).add(name)
    return owners


def undeclared(modules: dict[str, str], declared: frozenset[str]) -> list[str]:
    owners = _owners()
    problems = []
    for module, where in sorted(modules.items()):
        top = module.split(".")[0]
        if top in FIRST_PARTY or top in sys.stdlib_module_names:
            continue
        candidates = owners.get(top, set())
        if len(candidates) > 1:
            candidates = owners.get(".".join(module.split(".")[:2]), candidates)
        if not candidates:
            problems.append(f"{module} ({where}) comes from no installed distribution")
        elif not candidates & declared:
            problems.append(f"{module} ({where}) comes from {sorted(candidates)}, not declared in pyproject")
    return problems


def test_the_package_declares_what_it_imports() -> None:
    assert not undeclared(imported_modules(PACKAGE_DIRS), DECLARED_WITH_EXTRAS)


# Run by the peer's own virtualenv (`make bench-peer`), never by the project's: its imports
# are that virtualenv's pins, declared in the Makefile.
OWN_VIRTUALENV = frozenset({"bench/peer_server.py"})


def test_tests_and_benchmarks_declare_what_they_import() -> None:
    modules = {m: where for m, where in imported_modules(DEV_DIRS).items() if where not in OWN_VIRTUALENV}
    assert not undeclared(modules, DECLARED_DEV)


@pytest.mark.parametrize(
    ("module", "declared"),
    [
        ("starlette.responses", frozenset({"fastapi"})),
        ("google.protobuf.message", frozenset({"googleapis-common-protos"})),
    ],
)
def test_an_import_of_an_undeclared_distribution_is_caught(module: str, declared: frozenset[str]) -> None:
    """A module that arrives only through another distribution's requirements is reported,
    and so is one half of a shared namespace (``google``) declared by the other half only."""
    assert undeclared({module: "probe.py"}, declared)
