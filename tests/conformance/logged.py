"""The contract suite's servers log as ``agents serve`` does (access log on, JSON), each into a
file of one folder, so a summary check can search everything they logged for secrets."""

from __future__ import annotations

import atexit
import itertools
import pathlib
import shutil
import tempfile

from cleveragents.acp.gateway.observe.logs import Logging
from cleveragents.acp.gateway.observe.setup import Observability

_folder: pathlib.Path | None = None
_numbers = itertools.count()


def folder() -> pathlib.Path:
    global _folder
    if _folder is None:
        _folder = pathlib.Path(tempfile.mkdtemp(prefix="acp-contract-logs-"))
        atexit.register(shutil.rmtree, _folder, True)
    return _folder


def observability() -> Observability:
    stream = (folder() / f"server-{next(_numbers)}.log").open("a", encoding="utf-8")
    return Observability(
        logging=Logging(level="info", fmt="json", access_log=True, stream=stream, owns_stream=True)
    )


def lines() -> list[str]:
    return [line for path in sorted(folder().glob("*.log")) for line in path.read_text().splitlines()]
