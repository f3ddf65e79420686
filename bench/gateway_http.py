"""The gateway alone over one store, served by uvicorn two ways, for ``bench/layers.py``.

``python -m bench.gateway_http ours|httptools|h11 DB`` listens on an ephemeral loopback port
and prints ``bench-ready {"port": N}``; SIGTERM stops it. ``ours``: the HTTP/1.1 protocol
``agents serve`` uses (``gateway/http/protocol.py``, on uvicorn's h11); ``httptools``:
uvicorn's own fast path, the httptools parser; ``h11``: uvicorn's own h11 protocol (what
the hand-written writes replace). All on uvloop, as ``agents serve`` runs by default
(``gateway/loops.py``); everything else (the application, the facade, uvicorn's settings)
is the same.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import uvicorn
import uvloop

from bench.baselines import _ready, _until_signalled, _Uvicorn, listening_socket
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.gateway.http import protocol
from cleveragents.acp.gateway.http.app import build_app
from cleveragents.acp.gateway.http.protocol import ConnectionLimits


async def serve(kind: str, db: str) -> None:
    facade = open_facade(db)
    closing = asyncio.Event()
    app = build_app(facade, closing=closing)
    bounds = ConnectionLimits()
    http: Any = protocol.protocol_factory(bounds) if kind == "ours" else kind
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        server_header=False,
        http=http,
        h11_max_incomplete_event_size=bounds.max_header_bytes,
        timeout_keep_alive=bounds.idle_timeout,
        timeout_graceful_shutdown=1,
    )
    sock = listening_socket()
    server = _Uvicorn(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            raise RuntimeError("uvicorn stopped during start-up")
        await asyncio.sleep(0.01)
    _ready(sock.getsockname()[1])
    await _until_signalled()
    closing.set()
    server.should_exit = True
    await task
    await facade.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_http")
    parser.add_argument("kind", choices=["ours", "httptools", "h11"])
    parser.add_argument("db")
    args = parser.parse_args()
    uvloop.run(serve(args.kind, args.db))


if __name__ == "__main__":
    main()
