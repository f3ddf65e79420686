"""Generate the Python code of the ACP contract into a folder (``gen/`` or a temporary one).

The google/api and google/rpc protos come from the installed googleapis-common-protos
wheel and the well-known types from grpcio-tools, so no third-party proto is copied by
hand into the repository.
"""

from __future__ import annotations

import pathlib
import sys

import google.api
import grpc_tools
from grpc_tools import protoc

PROTO_ROOT = pathlib.Path(__file__).resolve().parent
PACKAGE_DIR = pathlib.Path("cleveragents", "acp", "v1")


def include_paths() -> list[str]:
    googleapis = pathlib.Path(next(iter(google.api.__path__))).parent.parent
    well_known = pathlib.Path(next(iter(grpc_tools.__path__))) / "_proto"
    return [str(PROTO_ROOT), str(googleapis), str(well_known)]


def generate(out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))
    args = ["grpc_tools.protoc", *(f"-I{p}" for p in include_paths())]
    args += [f"--python_out={out}", f"--grpc_python_out={out}", f"--mypy_out={out}", f"--mypy_grpc_out={out}"]
    if protoc.main([*args, *protos]) != 0:
        raise SystemExit("protoc failed")
    (out / PACKAGE_DIR / "__init__.py").write_text(
        '"""Code generated from proto/ by `make gen`; do not edit."""\n'
    )
    (out / PACKAGE_DIR / "py.typed").write_text("")


def descriptor_set(out: pathlib.Path) -> None:
    """Write a self-contained FileDescriptorSet, for buf and for tests."""
    protos = sorted(str(p.relative_to(PROTO_ROOT)) for p in (PROTO_ROOT / PACKAGE_DIR).glob("*.proto"))
    args = ["grpc_tools.protoc", *(f"-I{p}" for p in include_paths())]
    args += ["--include_imports", "--include_source_info", f"--descriptor_set_out={out}"]
    if protoc.main([*args, *protos]) != 0:
        raise SystemExit("protoc failed")


def main(argv: list[str]) -> None:
    if len(argv) == 3 and argv[1] == "--include-paths":
        print("\n".join(include_paths()))
        return
    if len(argv) != 2:
        raise SystemExit("usage: generate.py OUT_DIR | --include-paths X")
    generate(pathlib.Path(argv[1]))


if __name__ == "__main__":
    main(sys.argv)
