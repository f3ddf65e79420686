"""What every server of the benchmark's own shares: the ready line, the listening socket,
SIGTERM, uvicorn without its signal handlers.

Only the standard library and uvicorn: ``bench/peer_server.py`` imports this from the peer's
own virtualenv, which has neither the project nor its other dependencies.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
from collections.abc import Iterator

import uvicorn

READY = "bench-ready "


async def until_signalled() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


def listening_socket() -> socket.socket:
    """Bound as the gateway binds its HTTP socket. The protocol must be IPPROTO_TCP: asyncio
    sets TCP_NODELAY on accepted connections only then (without it, Nagle's algorithm
    and delayed ACKs hold every keep-alive response for 40 ms)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class Uvicorn(uvicorn.Server):
    """Leaves SIGTERM and SIGINT to ``until_signalled``."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
