"""Bypass detection: the import-linter contracts of pyproject.toml hold on the code, and each
one catches a deliberate violation (an import added to the real import graph), so none of
them passes for a wrong reason (a misspelt module, a source that imports nothing, an
exception wider than meant)."""

from __future__ import annotations

import copy
import itertools
import pathlib
import re
import tomllib
from collections.abc import Iterator
from typing import Any

import grimp
import pytest
from importlinter import configuration
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract
from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract
from importlinter.contracts.layers import LayersContract
from importlinter.domain.contract import Contract

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS: list[dict[str, Any]] = CONFIG["contracts"]
PROBE = "layer_probe"
KINDS: dict[str, type[Contract]] = {
    "forbidden": ForbiddenContract,
    "layers": LayersContract,
    "independence": IndependenceContract,
    "acyclic_siblings": AcyclicSiblingsContract,
}


@pytest.fixture(scope="module")
def graph() -> Any:
    configuration.configure()
    return grimp.build_graph(*CONFIG["root_packages"], include_external_packages=False)


def contract(options: dict[str, Any]) -> Contract:
    return KINDS[options["type"]](
        options["name"],
        session_options={"root_packages": CONFIG["root_packages"]},
        # As the TOML reader hands them over: booleans as strings.
        contract_options={
            k: str(v).lower() if isinstance(v, bool) else v
            for k, v in options.items()
            if k not in ("name", "type")
        },
    )


def kept(options: dict[str, Any], graph: Any) -> bool:
    """The contract's verdict on a copy: a check removes the imports it ignores from the graph."""
    return bool(contract(options).check(copy.deepcopy(graph), verbose=False).kept)


def layer_modules(layer: str) -> list[str]:
    return [name.strip() for name in re.split(r"[:|]", layer)]


def sibling_imports(options: dict[str, Any], graph: Any) -> Iterator[tuple[str, str]]:
    """For each package an acyclic contract checks, one import between two of its children
    (each with its descendants): (importing child, imported child)."""
    packages = list(options["ancestors"])
    while packages:
        package = packages.pop(0)
        children = sorted(graph.find_children(package))
        packages += [child for child in children if graph.find_children(child)]
        owner = {m: child for child in children for m in (child, *graph.find_descendants(child))}
        pairs = {
            (owner[importer], owner[imported])
            for importer in owner
            for imported in graph.find_modules_directly_imported_by(importer)
            if owner.get(imported, owner[importer]) != owner[importer]
        }
        if pairs:
            yield min(pairs)


def violations(options: dict[str, Any], graph: Any) -> Iterator[tuple[str, str]]:
    """(importer package, imported module) pairs the contract must refuse."""
    if options["type"] == "acyclic_siblings":
        # In every package checked, a child imported by a sibling imports that sibling back.
        for importing, imported in sibling_imports(options, graph):
            yield imported, importing
    elif options["type"] == "forbidden":
        for source in options["source_modules"]:
            for forbidden in options["forbidden_modules"]:
                yield source, forbidden
    elif options["type"] == "layers":
        layers = [layer_modules(layer) for layer in options["layers"]]
        for higher, lower in itertools.pairwise(layers):
            for below in lower:
                for above in higher:
                    yield below, above
        # The bottom layer reaches the top one, skipping every layer between.
        yield layers[-1][0], layers[0][0]
    else:
        modules = options["modules"]
        for importer in modules:
            for imported in modules:
                if importer != imported:
                    yield importer, imported
        for ignored in options.get("ignore_imports", ()):
            importer, imported = (part.strip() for part in ignored.split("->"))
            # The exception covers its one importer: a sibling module making the same import
            # is caught.
            yield importer.rsplit(".", 1)[0], imported


def test_the_contracts_cover_the_layers() -> None:
    kinds = {c["type"] for c in CONTRACTS}
    assert kinds == set(KINDS)
    sources = {m for c in CONTRACTS if c["type"] == "forbidden" for m in c["source_modules"]}
    assert {"cleveragents.acp.gateway", "cleveragents.acp.client", "cleveragents.acp.facade"} <= sources
    layered = [
        m for c in CONTRACTS if c["type"] == "layers" for layer in c["layers"] for m in layer_modules(layer)
    ]
    # Domain and store below everything but the contract runtime, which is below all.
    assert layered[-3:] == [
        "cleveragents.acp.facade.domain",
        "cleveragents.acp.facade.store",
        "cleveragents.acp.contract",
    ]
    independent = [c["modules"] for c in CONTRACTS if c["type"] == "independence"]
    assert ["cleveragents.acp.gateway", "cleveragents.acp.client"] in independent
    acyclic = [c["ancestors"] for c in CONTRACTS if c["type"] == "acyclic_siblings"]
    assert acyclic == [CONFIG["root_packages"]]


@pytest.mark.parametrize("options", CONTRACTS, ids=[c["name"][:40] for c in CONTRACTS])
def test_each_contract_holds_and_catches_a_violation(graph: Any, options: dict[str, Any]) -> None:
    assert kept(options, graph)
    caught = 0
    for package, imported in violations(options, graph):
        assert package in graph.modules, f"{package} names no module"
        assert imported in graph.modules, f"{imported} names no module"
        importer = f"{package}.{PROBE}"
        graph.add_module(importer)
        graph.add_import(
            importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}"
        )
        try:
            assert not kept(options, graph), (importer, imported)
        finally:
            graph.remove_module(importer)
        assert kept(options, graph)
        caught += 1
    assert caught


def test_the_no_cycles_allow_list_holds_only_live_cycles(
    graph: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The no-cycles contract's allow-list (its ``ignore_imports``) holds only cycles other
    work is removing: once one is gone its entry must go too. Prints the cycles the entries
    hide, so the list is easy to check."""
    for options in (c for c in CONTRACTS if c["type"] == "acyclic_siblings"):
        allowed = options.get("ignore_imports", [])
        for entry in allowed:
            rest = {k: v for k, v in options.items() if k != "ignore_imports"}
            if len(allowed) > 1:
                rest["ignore_imports"] = [other for other in allowed if other != entry]
            check = contract(rest).check(copy.deepcopy(graph), verbose=False)
            with capsys.disabled():
                for package, breakers in sorted(check.metadata.get("cycle_breakers_by_package", {}).items()):
                    for importer, imported in sorted(breakers):
                        print(f"\nallowed import cycle in {package}: {importer} -> {imported} closes it")
            assert not check.kept, f"{entry} closes no import cycle now: remove it from the allow-list"
