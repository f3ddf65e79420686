"""ACP 2 (test only), generated once per test session."""

from __future__ import annotations

import pathlib
from types import ModuleType

import pytest

from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.catalog import Catalog
from tests.proto_v2 import contract


@pytest.fixture(scope="session")
def v2_package(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    return contract.generate(tmp_path_factory.mktemp("acp-v2"))


@pytest.fixture(scope="session")
def v2_module(v2_package: pathlib.Path) -> ModuleType:
    return contract.load(v2_package)


@pytest.fixture(scope="session")
def v1_and_v2(v2_module: ModuleType) -> Catalog:
    """The product's ACP 1 and the test's ACP 2, side by side."""
    return Catalog([catalog.CATALOG.majors[1], catalog.major(v2_module, contract.V2)])
