"""``python -m tests.proto_v2.agents GEN_DIR ARGS...``: the real ``agents`` (CLI, ``serve``)
in a process that also holds the test-only ACP 2 generated into ``GEN_DIR``."""

from __future__ import annotations

import pathlib
import sys


def main() -> int:
    from tests.proto_v2 import contract

    contract.install(pathlib.Path(sys.argv.pop(1)))
    from tests.proto_v2 import handlers

    handlers.install_handlers()
    from cleveragents.acp.client.cli.main import main as agents

    return agents()


if __name__ == "__main__":
    sys.exit(main())
