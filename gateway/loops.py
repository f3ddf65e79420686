"""Which event loop a server runs on: uvloop where it is installed (as uvicorn's
``uvicorn[standard]`` users get it), asyncio's own elsewhere, or the one the operator names.

grpc.aio's per-call cost is lower on uvloop (issue 35 measured ``grpc_unary_ratio`` 0.76 and
0.94 on it against 0.69 and 0.77 on asyncio's loop in alternated pairs; docs/benchmarks.md
has this machine's figures); grpc.aio, the HTTP gateway and the store's threads run
unchanged on either.
"""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")

LoopName = Literal["auto", "asyncio", "uvloop"]
Loop = Literal["asyncio", "uvloop"]


class LoopUnavailableError(RuntimeError):
    """``--loop uvloop`` on a platform (or an install) without it."""


def available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve(name: LoopName) -> Loop:
    """The loop ``name`` stands for here: ``auto`` is uvloop when installed."""
    if name == "asyncio":
        return "asyncio"
    if available():
        return "uvloop"
    if name == "uvloop":
        raise LoopUnavailableError(
            "--loop uvloop: uvloop is not installed on this platform (pip install uvloop, or --loop asyncio)"
        )
    return "asyncio"


def factory(name: Loop) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def run(main: Coroutine[Any, Any, T], name: Loop) -> T:
    """``asyncio.run(main)`` on the loop ``name``."""
    with asyncio.Runner(loop_factory=factory(name)) as runner:
        return runner.run(main)


def running() -> str:
    """The name of the running loop, as the banner and ``/metrics`` say it."""
    loop = asyncio.get_running_loop()
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
