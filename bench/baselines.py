"""The raw servers every figure is divided by, each run in a process of its own.

``python -m bench.baselines grpc|http|sse [--frame FILE]`` listens on an ephemeral
loopback port and prints ``bench-ready {"port": N}``; SIGTERM stops it.

- ``grpc``: a grpc.aio unary echo (bytes in, the same bytes out), with the gateway
  server's options (``grpc.so_reuseport`` off).
- ``http``: a FastAPI app whose one route parses the JSON body with orjson and answers it
  back, served by uvicorn with the gateway's server settings.
- ``sse``: a Starlette ``StreamingResponse`` of ``?n=`` SSE frames, each the bytes of
  ``--frame`` with its own ``id:`` line, one ASGI message per frame as the gateway sends.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import grpc
import orjson
import uvicorn
from fastapi import FastAPI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

# READY re-exported: the families that start a baseline read its ready line by it.
from bench.serving import READY as READY
from bench.serving import Uvicorn, listening_socket, until_signalled

ECHO_METHOD = "/bench.Echo/Echo"


def _ready(port: int) -> None:
    print(READY + json.dumps({"port": port, "pid": os.getpid()}), flush=True)


def _identity(data: bytes) -> bytes:
    return data


async def serve_grpc() -> None:
    async def echo(data: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        return data

    handler = grpc.unary_unary_rpc_method_handler(
        echo, request_deserializer=_identity, response_serializer=_identity
    )
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("bench.Echo", {"Echo": handler})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    _ready(port)
    await until_signalled()
    await server.stop(1)


async def serve_asgi(app: Any, **settings: Any) -> None:
    """uvicorn with the settings ``gateway.server.Server`` gives it (and ``settings``), on
    the running loop. Its HTTP protocol is h11 unless ``settings`` say otherwise: uvicorn's
    ``auto`` picks httptools, which made the raw echo twice as fast and every gateway ratio
    half as large without the product changing. The product's gateway now runs on httptools
    too (``gateway/http/protocol.py``); the echo stays on h11 so that the ``unary`` family's
    ratios stay comparable with their history until their goals are set again
    (docs/benchmarks.md, "The gateway's protocol moved to httptools")."""
    sock = listening_socket()
    settings.setdefault("http", "h11")
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        server_header=False,
        timeout_graceful_shutdown=1,
        **settings,
    )
    server = Uvicorn(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            raise RuntimeError("uvicorn stopped during start-up")
        await asyncio.sleep(0.01)
    _ready(sock.getsockname()[1])
    await until_signalled()
    server.should_exit = True
    await task


def http_app() -> FastAPI:
    async def echo(request: Request) -> Response:
        body = orjson.loads(await request.body())
        return Response(orjson.dumps(body), media_type="application/json")

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    app.router.routes.append(Route("/echo", endpoint=echo, methods=["POST"]))
    return app


def sse_app(frame: bytes) -> Starlette:
    async def stream(request: Request) -> StreamingResponse:
        count = int(request.query_params.get("n", "1000"))

        async def frames() -> AsyncIterator[bytes]:
            yield b": stream open\n\n"
            for sequence in range(1, count + 1):
                yield b"id: %d\n" % sequence + frame

        return StreamingResponse(frames(), media_type="text/event-stream; charset=utf-8")

    return Starlette(routes=[Route("/stream", endpoint=stream)])


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines")
    parser.add_argument("kind", choices=["grpc", "http", "sse"])
    parser.add_argument("--frame", type=pathlib.Path, help="an SSE frame after its id line")
    args = parser.parse_args()
    if args.kind == "grpc":
        asyncio.run(serve_grpc())
    elif args.kind == "http":
        asyncio.run(serve_asgi(http_app()))
    else:
        frame = args.frame.read_bytes() if args.frame else b"event: x\ndata: {}\n\n"
        asyncio.run(serve_asgi(sse_app(frame)))


if __name__ == "__main__":
    main()
