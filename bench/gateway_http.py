"""The gateway alone over one store, served by uvicorn two ways, for ``bench/layers.py``.

``python -m bench.gateway_http ours|httptools DB`` listens on an ephemeral loopback port
and prints ``bench-ready {"port": N}``; SIGTERM stops it. ``ours``: the HTTP/1.1 protocol
``agents serve`` uses (``gateway/http/protocol.py``: uvicorn's httptools protocol with the
gateway's guards); ``httptools``: uvicorn's own httptools protocol, unguarded. Both on
uvloop, as ``agents serve`` runs by default (``gateway/loops.py``); everything else (the
application, the facade, uvicorn's settings) is the same.
"""

from __future__ import annotations

import argparse
from typing import Any

import uvloop

from bench import baselines
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.gateway.http import protocol
from cleveragents.acp.gateway.http.fastapi_app import build_app
from cleveragents.acp.gateway.http.protocol import ConnectionLimits


async def serve(kind: str, db: str) -> None:
    facade = open_facade(db)
    bounds = ConnectionLimits()
    http: Any = protocol.protocol_factory(bounds) if kind == "ours" else kind
    try:
        await baselines.serve_asgi(
            build_app(facade),
            http=http,
            timeout_keep_alive=bounds.idle_timeout,
        )
    finally:
        await facade.close()


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_http")
    parser.add_argument("kind", choices=["ours", "httptools"])
    parser.add_argument("db")
    args = parser.parse_args()
    uvloop.run(serve(args.kind, args.db))


if __name__ == "__main__":
    main()
