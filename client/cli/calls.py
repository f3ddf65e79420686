"""Running operation commands: connect, call, render, and map errors to exit codes.

Also the commands that are more than one call: ``events watch`` (follows the stream,
resuming after drops) and ``session chat`` (a REPL over ``session.tell``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TextIO

import httpx
from google.protobuf import message

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.cli import fields, operations, render
from cleveragents.acp.client.cli.connect import ConfigError, Connection, add_options, resolve
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.facade.contract import codec, envelope, errors
from cleveragents.acp.facade.contract.catalog import Operation
from cleveragents.acp.facade.contract.errors import ACPError
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.v1 import events_pb2, plan_pb2

EXIT_USAGE = 2
EXIT_UNREACHABLE = 12
TERMINAL_STATES = {
    plan_pb2.PLAN_STATE_SUCCEEDED,
    plan_pb2.PLAN_STATE_FAILED,
    plan_pb2.PLAN_STATE_CANCELLED,
    plan_pb2.PLAN_STATE_ROLLED_BACK,
}


def open_client(conn: Connection) -> ACPClient:
    ca = pathlib.Path(conn.ca_cert).read_bytes() if conn.ca_cert else None
    if conn.server:
        verify: Any = True
        if conn.ca_cert:
            import ssl

            verify = ssl.create_default_context(cafile=conn.ca_cert)
        http = httpx.AsyncClient(
            base_url=conn.server, verify=verify, timeout=httpx.Timeout(60.0, connect=5.0)
        )
        transport: Any = HTTPTransport(http, owns_client=True)
    elif conn.grpc:
        transport = GrpcTransport.connect(conn.grpc, tls=ca is not None, root_certificates=ca)
    else:
        transport = LocalTransport(open_facade(conn.db), owns_facade=True)
    return ACPClient(transport, acp_version=conn.acp_version, token=conn.token)


def _is_unreachable(exc: ACPError) -> bool:
    cause = str(exc.details.get("cause", ""))
    return exc.code == "INTERNAL_ERROR" and (
        exc.details.get("grpc_code") == "UNAVAILABLE"
        or cause.endswith(("ConnectError", "ConnectTimeout"))
        or exc.message.startswith("cannot reach")
    )


def _fail(exc: BaseException, conn: Connection | None, err: TextIO) -> int:
    if isinstance(exc, ACPError):
        if conn is not None and (conn.server or conn.grpc) and _is_unreachable(exc):
            err.write(f"UNAVAILABLE: cannot reach the ACP server at {conn.where}\n")
            return EXIT_UNREACHABLE
        err.write(f"{exc.code}: {exc.message}\n")
        return errors.exit_code(exc.code)
    if isinstance(exc, (ConfigError, fields.InputError)):
        err.write(f"agents: error: {exc}\n")
        return EXIT_USAGE
    if isinstance(exc, OSError) and conn is not None:
        err.write(f"UNAVAILABLE: cannot reach the ACP server at {conn.where}: {exc}\n")
        return EXIT_UNREACHABLE
    raise exc


def _print(op_response: message.Message, args: argparse.Namespace, started: float, request_id: str) -> None:
    out = sys.stdout
    if getattr(args, "envelope", None):
        data = codec.to_dict(op_response)
        version = getattr(args, "acp_version", None) or "1.1"
        out.write(
            json.dumps(envelope.ok(version, request_id, data, (time.monotonic() - started) * 1000)) + "\n"
        )
    elif getattr(args, "json", None):
        out.write(json.dumps(codec.to_dict(op_response), indent=2, ensure_ascii=False) + "\n")
    else:
        render.human(op_response, out, color=out.isatty())


async def _progress(client: ACPClient, plan_id: str, err: TextIO) -> None:
    """A live display of a plan's events on stderr (only when it is a terminal)."""
    async for event in client.subscribe(plan_id=plan_id):
        err.write(f"  {event.sequence:>6}  {describe(event)}\n")
        err.flush()


def describe(event: events_pb2.Event) -> str:
    kind = event.WhichOneof("payload")
    detail = ""
    if kind == "tool_invoked":
        detail = f"{event.tool_invoked.tool} ({event.tool_invoked.step_id})"
    elif kind == "tool_completed":
        ok = "ok" if event.tool_completed.ok else f"error: {event.tool_completed.error.message}"
        detail = f"{event.tool_completed.tool} {ok} in {event.tool_completed.duration_ms:.0f} ms"
    elif kind == "plan_state_changed":
        change = event.plan_state_changed
        detail = f"{plan_pb2.PlanPhase.Name(change.phase)}: {plan_pb2.PlanState.Name(change.to_state)}"
    elif kind == "plan_phase_changed":
        detail = plan_pb2.PlanPhase.Name(event.plan_phase_changed.to_phase)
    elif kind == "validation_completed":
        v = event.validation_completed
        detail = f"{v.validation} {'passed' if v.passed else 'failed: ' + '; '.join(v.messages)}"
    elif kind == "plan_decision_made":
        detail = f"{event.plan_decision_made.node.question} -> {event.plan_decision_made.node.choice}"
    elif kind == "session_message":
        detail = (
            event.session_message.message.content.splitlines()[0]
            if event.session_message.message.content
            else ""
        )
    elif kind == "plan_error":
        detail = f"{event.plan_error.error.code}: {event.plan_error.error.message}"
    ids = " ".join(
        x
        for x in (
            event.plan_id and f"plan={event.plan_id}",
            event.session_id and f"session={event.session_id}",
        )
        if x
    )
    return f"{event.type:<22} {detail}  {ids}".rstrip()


async def _call(conn: Connection, op: Operation, params: dict[str, Any], args: argparse.Namespace) -> int:
    client = open_client(conn)
    try:
        request = codec.from_dict(params, op.request_type)
        started = time.monotonic()
        progress: asyncio.Task[None] | None = None
        fields_by_name = op.request_type.DESCRIPTOR.fields_by_name
        if (
            "wait" in fields_by_name
            and "plan_id" in fields_by_name
            and params.get("wait")
            and sys.stderr.isatty()
        ):
            progress = asyncio.create_task(_progress(client, str(params["plan_id"]), sys.stderr))
        try:
            response = await client.call(op.name, request)
        finally:
            if progress is not None:
                progress.cancel()
                await asyncio.gather(progress, return_exceptions=True)
        _print(response, args, started, "")
        return 0
    finally:
        await client.close()


def run_operation(op: Operation, spec: list[fields.Argument], args: argparse.Namespace) -> int:
    conn: Connection | None = None
    try:
        conn = resolve(args)
        params = fields.params(args, spec)
        return asyncio.run(_call(conn, op, params, args))
    except (ACPError, ConfigError, fields.InputError, OSError) as exc:
        return _fail(exc, conn, sys.stderr)


def _run_async(args: argparse.Namespace, body: Callable[[ACPClient, Connection], Awaitable[int]]) -> int:
    conn: Connection | None = None
    try:
        conn = resolve(args)
        connection = conn

        async def main() -> int:
            client = open_client(connection)
            try:
                return await body(client, connection)
            finally:
                await client.close()

        return asyncio.run(main())
    except KeyboardInterrupt:
        return 130
    except (ACPError, ConfigError, fields.InputError, OSError) as exc:
        return _fail(exc, conn, sys.stderr)


def _ends_plan(event: events_pb2.Event) -> bool:
    kind = event.WhichOneof("payload")
    if kind in ("plan_error", "plan_apply_completed"):
        return True
    return kind == "plan_state_changed" and event.plan_state_changed.to_state in TERMINAL_STATES


async def watch(client: ACPClient, conn: Connection, args: argparse.Namespace) -> int:
    """Follow the stream; after a drop or a slow-subscriber end, resume from the last sequence."""
    last = args.after or 0
    delay = 0.2
    while True:
        try:
            async for event in client.subscribe(
                plan_id=args.plan or "",
                session_id=args.session or "",
                event_type=args.type or [],
                after_sequence=last,
            ):
                delay = 0.2
                last = event.sequence
                if getattr(args, "json", None):
                    sys.stdout.write(json.dumps(codec.to_dict(event)) + "\n")
                else:
                    sys.stdout.write(f"{event.sequence:>6}  {describe(event)}\n")
                sys.stdout.flush()
                if args.until_done and _ends_plan(event):
                    return 0
            if not (conn.server or conn.grpc):
                return 0
        except ACPError as exc:
            resumable = exc.details.get("refinement") == "SUBSCRIBER_TOO_SLOW" or _is_unreachable(exc)
            if not resumable:
                raise
            if "last_sequence" in exc.details:
                last = max(last, int(exc.details["last_sequence"]))
        except (httpx.TransportError, OSError):
            pass
        sys.stderr.write(f"stream ended; resuming after sequence {last}\n")
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)


async def chat(client: ACPClient, conn: Connection, args: argparse.Namespace) -> int:
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            sys.stdout.write("you> ")
            sys.stdout.flush()
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line or line.strip() in ("/quit", "/exit"):
            return 0
        if not line.strip():
            continue
        response = await client.call("session.tell", session_id=args.session_id, content=line.rstrip("\n"))
        render.human(response, sys.stdout, color=sys.stdout.isatty())
        sys.stdout.flush()


def register(subparsers: Any) -> None:
    groups = operations.register(subparsers, run_operation)
    verbs = groups["events"].get_default("verbs")
    watch_parser = verbs.add_parser(
        "watch",
        help="follow the event stream, resuming after dropped connections",
        description="Follow events until interrupted (or, with --until-done, until the plan ends).",
    )
    watch_parser.add_argument("--plan", metavar="PLAN_ID")
    watch_parser.add_argument("--session", metavar="SESSION_ID")
    watch_parser.add_argument("--type", action="append", metavar="EVENT_TYPE", help="repeatable")
    watch_parser.add_argument(
        "--after", type=int, default=0, metavar="SEQ", help="resume after this sequence"
    )
    watch_parser.add_argument("--until-done", action="store_true", help="stop when the plan's run ends")
    add_options(watch_parser, suppress=True)
    watch_parser.set_defaults(handler=lambda args: _run_async(args, lambda c, conn: watch(c, conn, args)))
    session_verbs = groups["session"].get_default("verbs")
    chat_parser = session_verbs.add_parser(
        "chat", help="a small REPL on top of session tell", description="Type messages; /quit or EOF ends."
    )
    chat_parser.add_argument("session_id", metavar="SESSION_ID")
    add_options(chat_parser, suppress=True)
    chat_parser.set_defaults(handler=lambda args: _run_async(args, lambda c, conn: chat(c, conn, args)))
