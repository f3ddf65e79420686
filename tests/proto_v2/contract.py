"""Generating the test-only ACP 2 contract and making it a major of the catalog.

``install`` makes the generated package importable as ``cleveragents.acp.v2`` and declares
its version table, as a release of ACP 2 would in ``contract/versions.py``; after that the
product finds the major the way it finds ACP 1 (``catalog.discover``).
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys
from types import MappingProxyType, ModuleType

from grpc_tools import protoc

from cleveragents.acp.contract import versions

PROTO_ROOT = pathlib.Path(__file__).resolve().parent / "proto"
PACKAGE = "cleveragents.acp.v2"
PACKAGE_DIR = pathlib.Path("cleveragents", "acp", "v2")
V2 = versions.VersionTable(major=2, current="2.0", supported=("2.0",), released=("2.0",))


def _include_paths() -> list[str]:
    """This contract's folder, then those ``proto/generate.py`` gives ACP 1 (googleapis, WKT)."""
    script = pathlib.Path(__file__).resolve().parents[2] / "proto" / "generate.py"
    spec = importlib.util.spec_from_file_location("acp_proto_generate", script)
    assert spec is not None
    assert spec.loader is not None
    generate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generate)
    return [str(PROTO_ROOT), *generate.include_paths()]


def generate(out: pathlib.Path) -> pathlib.Path:
    """The ACP 2 Python package generated under ``out``; its folder."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))
    args = ["grpc_tools.protoc", *(f"-I{p}" for p in _include_paths()), f"--python_out={out}"]
    if protoc.main([*args, *protos]) != 0:
        raise RuntimeError("protoc failed on the ACP 2 test contract")
    package = out / PACKAGE_DIR
    (package / "__init__.py").write_text('"""ACP 2, test only: generated at test time."""\n')
    return package


def load(package_dir: pathlib.Path) -> ModuleType:
    """Import the generated package as ``cleveragents.acp.v2``. Idempotent: a process holds
    one ACP 2 (its descriptors are in the default pool)."""
    if PACKAGE in sys.modules:
        return sys.modules[PACKAGE]
    spec = importlib.util.spec_from_file_location(
        PACKAGE, package_dir / "__init__.py", submodule_search_locations=[str(package_dir)]
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    spec.loader.exec_module(module)
    return module


def install(package_dir: pathlib.Path) -> ModuleType:
    """``load``, and declare ACP 2's version table: the product's catalog, built after this,
    then holds ACP 2 beside ACP 1. Only for a process of its own (``tests.proto_v2.agents``)."""
    module = load(package_dir)
    versions.TABLES = MappingProxyType({**versions.TABLES, V2.major: V2})
    return module


def session_pb2() -> ModuleType:
    return importlib.import_module(f"{PACKAGE}.session_pb2")
