"""Running operation commands: connect, call, render, and map errors to exit codes.

Also the commands that are more than one call: ``events watch`` (follows the stream,
resuming after drops) and ``session chat`` (a REPL over ``session.tell``).

Local mode runs the facade in this process: work a call starts in the background (a plan
run after ``plan execute`` without ``--wait``, or ``auto_execute``) would die with the
process, so the command waits for it before it exits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from google.protobuf import message

from cleveragents.acp.client.acp_client import ACPClient, in_major
from cleveragents.acp.client.cli import live, operations, render, value_path
from cleveragents.acp.client.cli.connect import (
    ConfigError,
    Connection,
    add_options,
    option,
    resolve,
    retry_policy,
)
from cleveragents.acp.client.cli.exits import (
    EXIT_AWAITING_APPROVAL,
    EXIT_INTERRUPTED,
    EXIT_PLAN_FAILED,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)
from cleveragents.acp.contract import catalog, envelope, errors, versions
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError, TransportError
from cleveragents.acp.contract.retry import Retrying, RetryPolicy
from cleveragents.acp.contract.transport import CallOptions
from cleveragents.acp.v1 import approval_pb2, events_pb2, plan_pb2, session_pb2

# A plan's run is over when a phase after strategize settles, or it fails, is cancelled
# or rolled back (``plan.error`` precedes the state change it causes, so it is no end).
_SETTLED = {plan_pb2.PLAN_STATE_FAILED, plan_pb2.PLAN_STATE_CANCELLED, plan_pb2.PLAN_STATE_ROLLED_BACK}
LOCAL_POLL_SECONDS = 0.5
PROGRESS_GRACE_SECONDS = 1.0


def open_client(conn: Connection, notify: Callable[[Retrying], None] | None = None) -> ACPClient:
    """The client for the connection; each transport is imported only when used, which
    keeps the start of a command short. ``notify`` is told of each retry (default: a line on
    stderr)."""
    ca = pathlib.Path(conn.ca_cert).read_bytes() if conn.ca_cert else None
    retry = retry_policy(conn, notify or _tell_retry)
    transport: Any
    if conn.server:
        import ssl

        import httpx

        from cleveragents.acp.client.http_transport import HTTPTransport

        verify: Any = ssl.create_default_context(cafile=conn.ca_cert) if conn.ca_cert else True
        http = httpx.AsyncClient(
            # No read limit: `plan execute --wait` answers when the run ends, however long.
            base_url=conn.server,
            verify=verify,
            timeout=httpx.Timeout(None, connect=5.0),
        )
        transport = HTTPTransport(http, owns_client=True, retry=retry)
    elif conn.grpc:
        from cleveragents.acp.client.grpc_transport import GrpcTransport

        transport = GrpcTransport.connect(conn.grpc, tls=ca is not None, root_certificates=ca, retry=retry)
    else:
        import sqlite3

        from cleveragents.acp.client.local import LocalTransport
        from cleveragents.acp.facade.factory import default_db_path, describe_db, open_facade

        try:
            facade = open_facade(conn.db, follow=True)
        except (sqlite3.Error, OSError, ValueError) as exc:
            raise LocalStoreError(
                f"cannot open the local database {describe_db(conn.db or default_db_path())}: {exc}"
            ) from exc
        transport = LocalTransport(facade, owns_facade=True)
    return ACPClient(transport, acp_version=conn.acp_version, token=conn.token)


def _tell_retry(retrying: Retrying) -> None:
    """Say on stderr why the command is waiting (as curl's --retry does)."""
    sys.stderr.write(
        f"agents: no answer from the server ({_reason(retrying.error)}); retrying in "
        f"{retrying.delay:.1f} s (attempt {retrying.attempt} of {retrying.attempts})\n"
    )
    sys.stderr.flush()


class LocalStoreError(Exception):
    """Local mode cannot open its database (exit 12, like a server that cannot be reached)."""


def _reason(exc: ACPError) -> str:
    """The short cause of a failed connection: "Connection refused", "Name or service not
    known": the innermost OS error behind the transport's, else the end of its message."""
    import ssl

    reason = ""
    cause: BaseException | None = exc
    for _ in range(10):
        if cause is None:
            break
        if isinstance(cause, ssl.SSLError):
            # Its errno is OpenSSL's (1), which strerror would call "Operation not permitted".
            return _tls_reason(cause)
        if isinstance(cause, OSError) and (cause.strerror or cause.errno):
            reason = os.strerror(cause.errno) if cause.errno and cause.errno > 0 else str(cause.strerror)
        cause = cause.__cause__ or cause.__context__
    if reason:
        return reason
    text = exc.message.rsplit(": ", 1)[-1]
    return re.sub(r"^\[Errno -?\d+\]\s*", "", text).strip(" []")


# What OpenSSL reports when the other end answers a TLS hello with plain text.
_NOT_TLS = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "HTTP_REQUEST", "UNKNOWN_PROTOCOL"})


def _tls_reason(exc: OSError) -> str:
    name = str(getattr(exc, "reason", "") or "")
    if name in _NOT_TLS:
        return "TLS handshake failed: the server does not speak TLS; is its URL http:// rather than https://?"
    detail = getattr(exc, "verify_message", None) or name or exc.strerror or str(exc)
    return f"TLS handshake failed: {detail}"


def call_options(conn: Connection) -> CallOptions:
    return CallOptions(acp_version=conn.acp_version, token=conn.token, request_id=envelope.new_request_id())


def is_unreachable(exc: ACPError) -> bool:
    """Both transports report a server they cannot reach (or lost) as a ``TransportError``."""
    return isinstance(exc, TransportError)


def fail(exc: BaseException, conn: Connection | None, err: TextIO) -> int:
    if isinstance(exc, ACPError):
        if conn is not None and (conn.server or conn.grpc) and is_unreachable(exc):
            attempts = exc.details.get("attempts", 1)
            tried = f"; {attempts} attempts" if isinstance(attempts, int) and attempts > 1 else ""
            err.write(f"UNAVAILABLE: cannot reach the ACP server at {conn.where} ({_reason(exc)}{tried})\n")
            return EXIT_UNREACHABLE
        err.write(f"{exc.code}: {exc.message}\n")
        return errors.exit_code(exc.code)
    if isinstance(exc, LocalStoreError):
        err.write(f"UNAVAILABLE: {exc}\n")
        return EXIT_UNREACHABLE
    if isinstance(exc, ConfigError):
        err.write(f"agents: error: {exc}\n")
        return EXIT_USAGE
    if isinstance(exc, OSError):
        where = conn.where if conn is not None else "(not connected)"
        err.write(f"UNAVAILABLE: {where}: {exc.strerror or exc}\n")
        return EXIT_UNREACHABLE
    raise exc


class OutputError(Exception):
    """``--value`` names nothing in the response (exit 2)."""


def _pick(data: Any, path: str) -> Any:
    value = data
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise OutputError(f"--value {path}: the response has no {part!r} there")
    return value


@dataclass
class Printer:
    """Writes a response the way the options ask: human, ``--json``, ``--envelope`` or
    ``--value``; colour only on a terminal."""

    args: argparse.Namespace
    conn: Connection
    out: TextIO
    # Whether the column headers of a stream of events were written.
    headed: bool = False

    def response(self, response: message.Message, request_id: str, started: float) -> None:
        if option(self.args, "value"):
            value = _pick(render.data(response), option(self.args, "value"))
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            self.out.write(f"{text}\n")
        elif option(self.args, "envelope"):
            data = render.data(response)
            elapsed = (time.monotonic() - started) * 1000
            self.out.write(json.dumps(envelope.ok(self._version(), request_id, data, elapsed)) + "\n")
        elif option(self.args, "json"):
            self.out.write(json.dumps(render.data(response), indent=2, ensure_ascii=False) + "\n")
        else:
            render.human(response, self.out, color=self.out.isatty())
        self.out.flush()

    def item(self, item: message.Message) -> None:
        """One item of a stream: a JSON line (``--value``: the value), or a line for people."""
        if option(self.args, "value"):
            value = _pick(render.data(item), option(self.args, "value"))
            self.out.write(f"{value if isinstance(value, str) else json.dumps(value)}\n")
        elif option(self.args, "json") or option(self.args, "envelope"):
            self.out.write(json.dumps(render.data(item), ensure_ascii=False) + "\n")
        elif isinstance(item, events_pb2.SubscribeEventsResponse):
            if not self.headed:
                self.out.write(render.event_header() + "\n")
                self.headed = True
            self.out.write(render.event_line(item.event) + "\n")
        else:
            render.human(item, self.out, color=self.out.isatty())
        self.out.flush()

    def event(self, event: events_pb2.Event) -> None:
        """One event of ``events watch``: with ``--json`` the event itself, one a line, its
        sequence a number (proto JSON writes int64 as a string) so ``jq`` compares it."""
        if option(self.args, "json") and not option(self.args, "value"):
            data = render.data(event)
            data["sequence"] = event.sequence
            self.out.write(json.dumps(data, ensure_ascii=False) + "\n")
            self.out.flush()
        else:
            self.item(events_pb2.SubscribeEventsResponse(event=event))

    def error(self, exc: ACPError, request_id: str, started: float) -> None:
        if option(self.args, "envelope"):
            elapsed = (time.monotonic() - started) * 1000
            self.out.write(json.dumps(envelope.error(self._version(), request_id, exc, elapsed)) + "\n")
            self.out.flush()

    def _version(self) -> str:
        return self.conn.acp_version or versions.CURRENT


def ends_run(event: events_pb2.Event) -> bool:
    if event.WhichOneof("payload") != "plan_state_changed":
        return False
    change = event.plan_state_changed
    if change.to_state in _SETTLED:
        return True
    return change.to_state == plan_pb2.PLAN_STATE_SUCCEEDED and change.phase != plan_pb2.PLAN_PHASE_STRATEGIZE


async def _progress(client: ACPClient, conn: Connection, plan_id: str, err: TextIO) -> None:
    """A live display of a plan's run on stderr (a terminal), fed by the event stream."""
    op = catalog.OPERATIONS["events.subscribe"]
    request = events_pb2.SubscribeEventsRequest(plan_id=plan_id)
    lines = live.TextLines(err, prefix="  model> ")
    async for item in await client.transport.open_stream(op, request, call_options(conn)):
        assert isinstance(item, events_pb2.SubscribeEventsResponse)
        delta = live.plan_text(item.event)
        if delta is not None:
            lines.delta("plan", delta.turn, delta.text)
            continue
        lines.line(f"  {render.progress_line(item.event)}")
        if ends_run(item.event):
            return


def _wants_progress(op: Operation, request: message.Message, err: TextIO) -> str:
    """The plan id to show progress for: a call that waits on a plan, on a terminal."""
    names = request.DESCRIPTOR.fields_by_name
    if "wait" in names and "plan_id" in names and request.wait and err.isatty():  # type: ignore[attr-defined]
        return str(request.plan_id)  # type: ignore[attr-defined]
    return ""


async def _waited_outcome(
    client: ACPClient, request: message.Message, response: message.Message, err: TextIO
) -> int:
    """A call that waited for a plan's run (``plan execute --wait``) answers with the plan
    even when the run failed: a script must not read that as success. A plan that waits for
    an approval: its question and how to answer it, on stderr."""
    if "wait" not in request.DESCRIPTOR.fields_by_name or not request.wait:  # type: ignore[attr-defined]
        return 0
    if "plan" not in response.DESCRIPTOR.fields_by_name:
        return 0
    plan: plan_pb2.Plan = response.plan  # type: ignore[attr-defined]
    if plan.state == plan_pb2.PLAN_STATE_AWAITING_APPROVAL:
        listed = await client.call(
            "approval.list", plan_id=plan.meta.id, state=approval_pb2.APPROVAL_STATE_PENDING
        )
        for approval in listed.approvals:  # type: ignore[attr-defined]
            err.write(render.approval_question(approval))
        return EXIT_AWAITING_APPROVAL
    if plan.state not in (plan_pb2.PLAN_STATE_FAILED, plan_pb2.PLAN_STATE_CANCELLED):
        return 0
    state = render.short_enum(plan_pb2.Plan.DESCRIPTOR.fields_by_name["state"], plan.state)
    why = f": {plan.last_error.code}: {plan.last_error.message}" if plan.last_error.code else ""
    err.write(f"agents: plan {plan.meta.id} {state}{why}\n")
    return EXIT_PLAN_FAILED


async def _settle(err: TextIO) -> None:
    """Local mode: wait for the background tasks the call started (plan runs)."""
    current = asyncio.current_task()
    told = False
    while pending := [task for task in asyncio.all_tasks() if task is not current and not task.done()]:
        if not told and err.isatty():
            err.write("local mode: waiting for the work this command started (Ctrl-C stops it)\n")
            told = True
        await asyncio.gather(*pending, return_exceptions=True)


async def _call(conn: Connection, op: Operation, request: message.Message, args: argparse.Namespace) -> int:
    # A command is the default major's operation where it has one; --acp-version 2.0 calls
    # ACP 2's of the same name. One only a later major has is called there unless the
    # connection names a version (then that major's NOT_FOUND says it lacks the operation).
    if conn.acp_version or op.major == catalog.CATALOG.default.number:
        op, request = in_major(op, request, catalog.CATALOG.major_for(conn.acp_version))
    printer = Printer(args, conn, sys.stdout)
    client = open_client(conn)
    options = call_options(conn)
    options.if_revision = getattr(args, "if_revision", None)
    started = time.monotonic()
    try:
        if op.server_streaming:
            async for item in await client.transport.open_stream(op, request, options):
                printer.item(item)
            return 0
        plan_id = _wants_progress(op, request, sys.stderr)
        progress = asyncio.create_task(_progress(client, conn, plan_id, sys.stderr)) if plan_id else None
        try:
            response = await client.transport.call(op, request, options)
            if progress is not None:
                await asyncio.wait({progress}, timeout=PROGRESS_GRACE_SECONDS)
        finally:
            if progress is not None:
                progress.cancel()
                await asyncio.gather(progress, return_exceptions=True)
        printer.response(response, options.request_id, started)
        if not (conn.server or conn.grpc):
            await _settle(sys.stderr)
        return await _waited_outcome(client, request, response, sys.stderr)
    except ACPError as exc:
        printer.error(exc, options.request_id, started)
        raise
    finally:
        await client.close()


def _run(args: argparse.Namespace, body: Callable[[Connection], Coroutine[Any, Any, int]]) -> int:
    conn: Connection | None = None
    try:
        conn = resolve(args)
        return asyncio.run(body(conn))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OutputError as exc:
        sys.stderr.write(f"agents: error: {exc}\n")
        return EXIT_USAGE
    except (ACPError, ConfigError, LocalStoreError, OSError) as exc:
        return fail(exc, conn, sys.stderr)


def run_operation(op: Operation, request: message.Message, args: argparse.Namespace) -> int:
    return _run(args, lambda conn: _call(conn, op, request, args))


def _with_client(
    args: argparse.Namespace, body: Callable[[ACPClient, Connection], Awaitable[int]]
) -> Callable[[Connection], Coroutine[Any, Any, int]]:
    async def run(conn: Connection) -> int:
        client = open_client(conn)
        try:
            return await body(client, conn)
        finally:
            await client.close()

    return run


async def _events(items: AsyncIterator[message.Message], poll: bool) -> AsyncIterator[events_pb2.Event]:
    """The events of one admitted subscription. With ``poll`` it ends once no event came
    for a while, so the caller subscribes again and sees what other processes added to
    the database."""
    iterator = aiter(items)
    try:
        while True:
            try:
                if poll:
                    item = await asyncio.wait_for(anext(iterator), LOCAL_POLL_SECONDS)
                else:
                    item = await anext(iterator)
            except (StopAsyncIteration, TimeoutError):
                return
            assert isinstance(item, events_pb2.SubscribeEventsResponse)
            yield item.event
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()


_TERMINAL = _SETTLED | {plan_pb2.PLAN_STATE_SUCCEEDED}


async def _until(client: ACPClient, conn: Connection, plan_id: str) -> Callable[[events_pb2.Event], bool]:
    """When ``--until-done`` stops. A plan still to run or running: when its run ends. A
    plan already settled (executed, applied, rolled back): at the state change that left it
    as it is now, the one published after its phase ended, so everything up to then shows."""
    op = catalog.OPERATIONS["plan.status"]
    response = await client.transport.call(
        op, plan_pb2.GetPlanStatusRequest(plan_id=plan_id), call_options(conn)
    )
    assert isinstance(response, plan_pb2.GetPlanStatusResponse)
    plan = response.plan
    timing = next((t for t in plan.timings if t.phase == plan.phase), None)
    if plan.state not in _TERMINAL or timing is None or not timing.HasField("end_time"):
        return ends_run
    ended = timing.end_time.ToNanoseconds()

    def settled(event: events_pb2.Event) -> bool:
        if event.WhichOneof("payload") != "plan_state_changed":
            return False
        change = event.plan_state_changed
        return (
            change.phase == plan.phase
            and change.to_state == plan.state
            and event.time.ToNanoseconds() >= ended
        )

    return settled


async def watch(client: ACPClient, conn: Connection, args: argparse.Namespace) -> int:
    """Follow the stream. After a drop, a server restart or a slow-subscriber end it
    subscribes again after the last sequence it printed: nothing lost, nothing twice."""
    printer = Printer(args, conn, sys.stdout)
    done = await _until(client, conn, args.plan) if args.until_done else None
    subscribe = catalog.OPERATIONS["events.subscribe"]
    remote = bool(conn.server or conn.grpc)
    last = args.after
    connected = False
    lost = False
    delay = 0.2
    while True:
        request = events_pb2.SubscribeEventsRequest(
            plan_id=args.plan or "",
            session_id=args.session or "",
            event_type=args.type or [],
            after_sequence=last,
            namespace=args.namespace or "",
        )
        try:
            # This loop is the retrying (without end, once connected): the transport's is off.
            options = call_options(conn)
            options.retry = RetryPolicy.OFF
            items = await client.transport.open_stream(subscribe, request, options)
            connected, delay = True, 0.2
            if lost:
                sys.stderr.write(f"reconnected; resuming after sequence {last}\n")
                lost = False
            async for event in _events(items, poll=not remote):
                if event.sequence <= last:
                    continue
                last = event.sequence
                printer.event(event)
                if done is not None and done(event):
                    return 0
            if not remote:
                continue
            why = "the server closed the stream"
        except ACPError as exc:
            slow = exc.details.get("refinement") == "SUBSCRIBER_TOO_SLOW"
            if not (slow or (remote and connected and is_unreachable(exc))):
                raise
            why = "the server ended the stream: this watcher fell behind" if slow else "connection lost"
        if not lost:
            sys.stderr.write(f"{why}; reconnecting to resume after sequence {last}\n")
            lost = True
        await asyncio.sleep(delay)
        delay = min(delay * 2, 5.0)


async def chat(client: ACPClient, conn: Connection, args: argparse.Namespace) -> int:
    """Read lines, tell each to the session, print the replies (a model orchestrator's text
    as it streams); /quit or end of input ends. A refused message is reported and the
    conversation goes on."""
    shown = await client.call("session.show", session_id=args.session_id)
    first = shown.session.message_count  # type: ignore[attr-defined]
    replies = live.LiveReplies(client, args.session_id, first, sys.stdout)
    await replies.start()
    try:
        return await _converse(client, args, replies)
    finally:
        await replies.stop()


async def _converse(client: ACPClient, args: argparse.Namespace, replies: live.LiveReplies) -> int:
    interactive = sys.stdin.isatty()
    if interactive:
        sys.stdout.write("Type a message; /help asks the orchestrator, /quit ends.\n")
    while True:
        if interactive:
            sys.stdout.write("you> ")
            sys.stdout.flush()
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line or line.strip() in ("/quit", "/exit"):
            return 0
        if not line.strip():
            continue
        try:
            response = await client.call(
                "session.tell", session_id=args.session_id, content=line.rstrip("\n")
            )
        except ACPError as exc:
            if is_unreachable(exc) or exc.code in ("AUTH_REQUIRED", "AUTH_FORBIDDEN", "NOT_FOUND"):
                raise
            sys.stderr.write(f"{exc.code}: {exc.message}\n")
            continue
        assert isinstance(response, session_pb2.TellSessionResponse)
        rest = await replies.settle(response)
        render.human(session_pb2.TellSessionResponse(replies=rest), sys.stdout, color=sys.stdout.isatty())
        sys.stdout.flush()


WATCH_EPILOG = """\
examples:
  agents events watch                            everything, live
  agents events watch --plan PLAN_ID --until-done
  agents events watch --type plan.state_changed --type tool.completed --json
  agents events watch --after 120                 resume after sequence 120

In local mode it re-reads the database every half second, so it follows what other
processes (another agents command, a server) record there."""


def register(subparsers: Any, words: Sequence[str] | None = None) -> None:
    """A command per operation (of those ``words`` names, only its parsers in full), and
    ``events watch`` and ``session chat`` when their group is built in full."""
    groups = operations.register(
        subparsers, run_operation, words=words, extra_verbs={"events": ["watch"], "session": ["chat"]}
    )
    if "events" in groups:
        _register_watch(groups["events"])
    if "session" in groups:
        _register_chat(groups["session"])


def _register_watch(events: argparse.ArgumentParser) -> None:
    verbs = events.get_default("verbs")
    watch_parser = verbs.add_parser(
        "watch",
        help="follow the event stream, resuming after dropped connections",
        description="Print events as they happen, until interrupted (or, with --until-done, "
        "until the plan's run ends). A dropped connection or a server restart is resumed "
        "after the last sequence printed: no event is lost or printed twice.",
        epilog=WATCH_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    watch_parser.add_argument("--plan", metavar="PLAN_ID", help="only this plan's events")
    watch_parser.add_argument("--session", metavar="SESSION_ID", help="only this session's events")
    watch_parser.add_argument("--type", action="append", metavar="EVENT_TYPE", help="repeatable")
    watch_parser.add_argument("--namespace", help="only this namespace")
    watch_parser.add_argument(
        "--after",
        type=int,
        default=0,
        metavar="SEQ",
        help="start after this sequence (default: all retained)",
    )
    watch_parser.add_argument(
        "--until-done",
        action="store_true",
        help="with --plan: stop when its run ends (execute or apply settles, fails, is cancelled "
        "or rolled back); for a plan already settled, after the events up to its current state",
    )
    add_options(watch_parser)

    def run_watch(args: argparse.Namespace) -> int:
        if args.until_done and not args.plan:
            watch_parser.error("--until-done needs --plan")
        wanted = option(args, "value")
        mistake = wanted and value_path.problem(events_pb2.SubscribeEventsResponse.DESCRIPTOR, wanted)
        if mistake:
            watch_parser.error(mistake)
        return _run(args, _with_client(args, lambda client, conn: watch(client, conn, args)))

    watch_parser.set_defaults(handler=run_watch, connects=True)


def _register_chat(session: argparse.ArgumentParser) -> None:
    session_verbs = session.get_default("verbs")
    chat_parser = session_verbs.add_parser(
        "chat",
        help="a small REPL on top of session tell",
        description="Type messages to the session's orchestrator and read its replies; /quit or "
        "end of input ends. Lines from a pipe work too.",
        epilog="example:\n  agents session chat SESSION_ID",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    chat_parser.add_argument("session_id", metavar="SESSION_ID")
    add_options(chat_parser)
    chat_parser.set_defaults(
        handler=lambda args: _run(args, _with_client(args, lambda client, conn: chat(client, conn, args))),
        connects=True,
    )
