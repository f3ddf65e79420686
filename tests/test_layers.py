"""Bypass detection: the import-linter contracts of pyproject.toml hold on the code, and each
one catches a deliberate violation (an import added to the real import graph), so none of
them passes for a wrong reason (a misspelt module, a source that imports nothing)."""

from __future__ import annotations

import pathlib
import tomllib
from typing import Any

import grimp
import pytest
from importlinter import configuration
from importlinter.contracts.forbidden import ForbiddenContract

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
CONTRACTS: list[dict[str, Any]] = CONFIG["contracts"]
PROBE = "layer_probe"


@pytest.fixture(scope="module")
def graph() -> Any:
    configuration.configure()
    return grimp.build_graph(*CONFIG["root_packages"], include_external_packages=False)


def contract(options: dict[str, Any]) -> ForbiddenContract:
    return ForbiddenContract(
        options["name"],
        session_options={"root_packages": CONFIG["root_packages"]},
        # As the TOML reader hands them over: booleans as strings.
        contract_options={
            k: str(v).lower() if isinstance(v, bool) else v
            for k, v in options.items()
            if k not in ("name", "type")
        },
    )


def test_the_contracts_cover_the_layers() -> None:
    assert {c["type"] for c in CONTRACTS} == {"forbidden"}
    sources = {m for c in CONTRACTS for m in c["source_modules"]}
    assert {"cleveragents.acp.gateway", "cleveragents.acp.client", "cleveragents.acp.facade"} <= sources
    assert "cleveragents.acp.facade.domain" in sources


@pytest.mark.parametrize("options", CONTRACTS, ids=[c["name"][:40] for c in CONTRACTS])
def test_each_contract_holds_and_catches_a_violation(graph: Any, options: dict[str, Any]) -> None:
    assert contract(options).check(graph, verbose=False).kept
    for source in options["source_modules"]:
        assert source in graph.modules, f"{source} names no module"
        for forbidden in options["forbidden_modules"]:
            assert forbidden in graph.modules, f"{forbidden} names no module"
            importer = f"{source}.{PROBE}"
            graph.add_module(importer)
            graph.add_import(
                importer=importer, imported=forbidden, line_number=1, line_contents=f"import {forbidden}"
            )
            try:
                assert not contract(options).check(graph, verbose=False).kept, (source, forbidden)
            finally:
                graph.remove_module(importer)
            assert contract(options).check(graph, verbose=False).kept
