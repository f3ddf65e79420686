"""The peer the product is measured against (family ``peer``): the A2A Python SDK's server.

Run by the peer's own virtualenv (``make bench-peer`` makes it under ``.build/peer``), never
by the project's, so the SDK's pins never meet ours: ``.build/peer/bin/python -m
bench.peer_server`` serves ``GetTask`` over gRPC (the SDK's ``GrpcHandler`` on grpc.aio) and
over HTTP JSON-RPC (its Starlette routes under uvicorn) in one process, as ``agents serve``
serves both, with one task in the SDK's default ``InMemoryTaskStore``. It prints
``bench-ready {"grpc": PORT, "http": PORT, "task_id": ID, ...}`` once both listen; SIGTERM
stops it.

Set up as a user of the SDK would run it in production, at its fastest: uvicorn's defaults
with ``uvicorn[standard]`` (uvloop, httptools) but no access log, grpc.aio on the same loop.
At module level only what both virtualenvs have (the standard library, uvicorn,
``bench/serving.py``): the project's venv imports the names of the calls from here.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import importlib.metadata
import json
import os
from typing import Any

import uvicorn

from bench.serving import READY, Uvicorn, listening_socket, until_signalled

GRPC_METHOD = "/lf.a2a.v1.A2AService/GetTask"
JSONRPC_PATH = "/a2a/jsonrpc"
# The A2A version a 1.x request names (without it the SDK takes it for 0.3 and refuses).
VERSION_HEADER = "A2A-Version"
VERSION = "1.0"


async def serve(http: str) -> None:
    import grpc
    from a2a.auth.user import UnauthenticatedUser
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.context import ServerCallContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler, GrpcHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.tasks import InMemoryTaskStore
    from a2a.types import a2a_pb2, a2a_pb2_grpc
    from google.protobuf.timestamp_pb2 import Timestamp
    from starlette.applications import Starlette

    class Idle(AgentExecutor):  # type: ignore[misc]
        """Never called: the benchmark only reads a task that is already stored."""

        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            raise NotImplementedError

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            raise NotImplementedError

    card = a2a_pb2.AgentCard(
        name="bench",
        description="The peer of the product's benchmark",
        version="1.0.0",
        supported_interfaces=[
            a2a_pb2.AgentInterface(
                url="http://127.0.0.1/", protocol_binding="JSONRPC", protocol_version=VERSION
            )
        ],
        capabilities=a2a_pb2.AgentCapabilities(streaming=False),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[a2a_pb2.AgentSkill(id="bench", name="bench", description="reads tasks", tags=["bench"])],
    )
    store = InMemoryTaskStore()
    handler = DefaultRequestHandler(agent_executor=Idle(), task_store=store, agent_card=card)
    # About the size of the product's session.show answer (105 bytes of protobuf): a
    # finished task with a time stamp and two metadata values, no history or artifacts.
    stamp = Timestamp()
    stamp.GetCurrentTime()
    task = a2a_pb2.Task(
        id="0f8e1c8e-6f57-4d55-9a4c-1f0b7c4e2a11",
        context_id="6b2f7f0d-0d4b-4b8c-8c55-3c9e5a1d7b22",
        status=a2a_pb2.TaskStatus(state=a2a_pb2.TaskState.TASK_STATE_COMPLETED, timestamp=stamp),
    )
    task.metadata.update({"title": "bench", "team": "bench"})
    await store.save(task, ServerCallContext(user=UnauthenticatedUser()))

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    a2a_pb2_grpc.add_A2AServiceServicer_to_server(GrpcHandler(handler), server)
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()

    app = Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, JSONRPC_PATH)])
    sock = listening_socket()
    config = uvicorn.Config(app, http=http, lifespan="off", log_level="warning", access_log=False)
    web = Uvicorn(config)
    serving = asyncio.create_task(web.serve(sockets=[sock]))
    while not web.started:
        if serving.done():
            raise RuntimeError("uvicorn stopped during start-up")
        await asyncio.sleep(0.01)
    info: dict[str, Any] = {
        "grpc": grpc_port,
        "http": sock.getsockname()[1],
        "task_id": task.id,
        "task_bytes": task.ByteSize(),
        # The request the load sends over gRPC, encoded here: the project's venv has no a2a types.
        "get_task_request": base64.b64encode(a2a_pb2.GetTaskRequest(id=task.id).SerializeToString()).decode(),
        "pid": os.getpid(),
        "loop": type(asyncio.get_running_loop()).__module__.split(".")[0],
        "http_protocol": http,
        "versions": {
            name: importlib.metadata.version(name)
            for name in ("a2a-sdk", "grpcio", "protobuf", "uvicorn", "starlette")
        },
    }
    print(READY + json.dumps(info), flush=True)
    await until_signalled()
    web.should_exit = True
    await serving
    await server.stop(1)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.peer_server")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument("--http", choices=["httptools", "h11"], default="httptools")
    args = parser.parse_args()
    if args.loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(serve(args.http))
    else:
        asyncio.run(serve(args.http))


if __name__ == "__main__":
    main()
