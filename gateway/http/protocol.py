"""uvicorn's HTTP/1.1 protocol with the bounds the gateway needs below the application:
header size, time to send a request, connections in all and per client.

uvicorn refuses an oversized or malformed request with a plain-text 400, never times out a
client that trickles its headers (each byte cancels the keep-alive timer), and has no
per-client cap. Here each refusal is an ACP envelope, written by the protocol itself since
no request reaches the application:

- headers over ``max_header_bytes``: INVALID_PARAMS (``details.field`` ``headers``); any
  other unreadable request: INVALID_PARAMS (``field`` ``request``);
- a request whose headers are not complete within ``header_timeout`` seconds of the
  connection (or of the previous response), or whose body is not complete within
  ``body_timeout`` more: INVALID_PARAMS (refinement ``REQUEST_TIMEOUT``), then closed;
- a connection over ``max_connections_per_client`` from one address: BUDGET_EXCEEDED
  (refinement ``TOO_MANY_CONNECTIONS``), then closed;
- a request body that falls below ``min_body_rate`` bytes a second on average since its
  headers, once ``min_body_rate_grace`` seconds have passed (Kestrel's
  MinRequestBodyDataRate, 240 B/s after 5 s): INVALID_PARAMS (refinement
  ``REQUEST_TIMEOUT``, ``details.min_bytes_per_second``), then closed. Time the server
  itself stops reading (its buffer full while the application waits, as a large import
  waits for its turn) is not held against the client;
- a connection over ``max_connections`` in all makes room instead (``Clients.evictable``):
  from the address with the most connections, its oldest idle connection (no request under
  way: never sent one, or between two), else the body furthest behind the minimum rate
  (no grace here: the server is full), refused as above. Only when no connection is idle or
  behind is the newcomer refused as above. 2,100 slow connections from 9 addresses once
  got 20 of 25 legitimate newcomers refused, and 40 trickled bodies from 4 addresses 5 of 5;
  now they lose their own connections first.

After a refusal the connection reads and drops what the client still sends for a moment
before closing, so the client sees the answer instead of a reset. So does any close while the
client is still sending its request body (nginx's "lingering close"): the application answers a
body over ``--max-body-bytes`` at once, from its declared length, and a client that asked for
``Connection: close`` (urllib does) would otherwise get a reset while it sends, before it reads.

A client that drops its connection before its answer began ends the call's wait: the request's
application task is cancelled, as gRPC cancels a call whose deadline passed (what the call's
work does then is the operation's ``when_abandoned``: docs/server.md, "Deadlines and disconnects").

An answer whose head declares its length and whose whole body follows in one message (every
envelope, every plain Starlette response) is written here as the bytes h11 would write, in
one write, and h11's state moved as its three sends would move it (``_Answering``): h11's
event machinery cost more than the rest of the gateway's HTTP work. Anything else (streams,
HEAD, a closing connection, headers h11 would refuse) goes through uvicorn's ``send``.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

import h11
import orjson
from h11._abnf import field_name, field_value
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol, RequestResponseCycle
from uvicorn.server import ServerState

from cleveragents.acp.contract import envelope, limits, versions
from cleveragents.acp.contract.errors import ACPError, ErrorCode, http_status
from cleveragents.acp.contract.stopping import server_stopping

# How long a refused connection keeps draining what the client still sends, and how much.
_LINGER_SECONDS = 2.0
_LINGER_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ConnectionLimits:
    """The bounds of one HTTP server's connections (settings of ``agents serve``)."""

    max_header_bytes: int = limits.DEFAULT_MAX_HEADER_BYTES
    header_timeout: float = limits.DEFAULT_HEADER_TIMEOUT
    body_timeout: float = limits.DEFAULT_BODY_TIMEOUT
    idle_timeout: int = limits.DEFAULT_IDLE_TIMEOUT
    max_connections: int = limits.DEFAULT_MAX_CONNECTIONS
    max_connections_per_client: int = limits.DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    min_body_rate: int = limits.MIN_BODY_RATE
    min_body_rate_grace: float = limits.MIN_BODY_RATE_GRACE


class _Lingering:
    """The connection's transport as uvicorn sees it: a ``close`` while the client is still
    sending its request body lingers instead (``GuardedH11Protocol.linger``).

    uvicorn writes a response's head and its body with a ``write`` each: two sends, two
    segments, two wake-ups of the client. Here a response's first write (its head) is held
    until the next write, which takes it along, or until the loop's next turn at the latest:
    an answer sent at once (every envelope) leaves in one send, a stream's head still leaves
    before the stream waits for its first item."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedH11Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._held: bytes | None = None
        # The request cycle whose head was held (only a response's first write is held).
        self._headed: object = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._transport.write(held + data)
            return
        if not data:
            return
        cycle = self._protocol.cycle
        if cycle is not None and cycle is not self._headed:
            self._headed = cycle
            self._held = data
            self._protocol.loop.call_soon(self.flush)
            return
        self._transport.write(data)

    def flush(self) -> None:
        """Send a held head (its body did not follow in the same turn of the loop)."""
        held = self._held
        if held is not None:
            self._held = None
            if not self._protocol.lost:
                self._transport.write(held)

    def close(self) -> None:
        self.flush()
        protocol = self._protocol
        sending = protocol.conn.their_state is h11.SEND_BODY
        if sending and not (protocol.draining or protocol.lost or self._transport.is_closing()):
            protocol.linger()
        else:
            self._transport.close()

    def is_closing(self) -> bool:
        """Closing once lingering: uvicorn arms no keep-alive and reads no next request."""
        return bool(self._protocol.draining) or self._transport.is_closing()

    def write_answer(self, data: bytes, cycle: object) -> None:
        """A whole answer of ``cycle``: nothing to hold."""
        self._headed = cycle
        held = self._held
        if held is not None:
            self._held = None
            data = held + data
        self._transport.write(data)


# A response head's header lines (joined by CRLF) as h11 accepts each name and value; with
# one CRLF fewer than lines, no value held one.
_HEADER = b"%s: %s" % (field_name.encode("ascii"), field_value.encode("ascii"))
_HEADER_LINES = re.compile(_HEADER + rb"(?:\r\n" + _HEADER + rb")*")
_NAME = re.compile(field_name.encode("ascii"))
# Header names found valid, with their lower-case form: the few an application sends, checked
# once (bounded all the same: past the bound, names are checked every time).
_NAMES: dict[bytes, bytes] = {}
_MAX_NAMES = 256
# Headers that make h11 frame, order or close a response itself.
_FRAMING = frozenset({b"connection", b"transfer-encoding", b"host"})
_CONTENT_LENGTH = b"content-length"
# Status codes whose responses have no body whatever their headers say.
_BODILESS = frozenset({204, 304})


def _declared_length(headers: Any) -> bytes | None:
    """The Content-Length value of an answer this module may write itself: exactly one, no
    header h11 acts on, every name one h11 accepts."""
    declared = None
    try:
        for name, value in headers:
            lower = _NAMES.get(name)
            if lower is None:
                if _NAME.fullmatch(name) is None:
                    return None
                lower = name.lower()
                if len(_NAMES) < _MAX_NAMES:
                    _NAMES[name] = lower
            if lower == _CONTENT_LENGTH:
                if declared is not None:
                    return None
                declared = value
            elif lower in _FRAMING:
                return None
    except (TypeError, ValueError):
        return None
    return declared


class _Answering:
    """The ASGI ``send`` of one request cycle (the module's docstring).

    A start whose head declares a length is kept until the next message; when that is the
    whole body, the answer is written here, else both go to uvicorn's ``send`` in turn."""

    __slots__ = ("cycle", "declared", "protocol", "send", "start")

    def __init__(self, protocol: GuardedH11Protocol, cycle: RequestResponseCycle) -> None:
        self.protocol = protocol
        self.cycle = cycle
        self.send = cycle.send
        self.start: Any = None
        self.declared: bytes | None = None

    async def __call__(self, message: Any) -> None:
        cycle = self.cycle
        start = self.start
        if start is None:
            if message["type"] == "http.response.start" and not cycle.response_started:
                declared = _declared_length(message.get("headers", ()))
                if declared is not None:
                    self.start = message
                    self.declared = declared
                    cycle.response_started = True
                    cycle.waiting_for_100_continue = False
                    return
            await self.send(message)
            return
        self.start = None
        if (
            message["type"] == "http.response.body"
            and not message.get("more_body", False)
            and self._write(start, message.get("body", b""))
        ):
            return
        cycle.response_started = False
        await self.send(start)
        await self.send(message)

    def _write(self, start: Any, body: Any) -> bool:
        """Write ``start`` and ``body`` as one answer, as uvicorn and h11 would have written
        them, and finish the cycle; False (nothing done) when this answer is not one of those."""
        cycle = self.cycle
        conn = cycle.conn
        state = conn._cstate  # noqa: SLF001  # h11's state machine, moved by hand (module docstring)
        status = start["status"]
        reason = STATUS_PHRASES.get(status)
        if (
            reason is None
            or status < 200
            or status in _BODILESS
            or cycle.disconnected
            or not cycle.keep_alive
            or cycle.flow.write_paused
            or cycle.scope["method"] == "HEAD"
            or conn.our_state is not h11.SEND_RESPONSE
            or not state.keep_alive
            or state.pending_switch_proposals
            or not isinstance(body, bytes)
            or self.declared != b"%d" % len(body)
        ):
            return False
        headers = [*cycle.default_headers, *start.get("headers", ())]
        try:
            lines = b"\r\n".join(map(b": ".join, headers))
        except TypeError:
            return False
        if _HEADER_LINES.fullmatch(lines) is None or lines.count(b"\r\n") != len(headers) - 1:
            return False
        self.protocol.transport.write_answer(
            b"HTTP/1.1 %d %s\r\n%s\r\n\r\n%s" % (status, reason, lines, body), cycle
        )
        # h11's state after it sent the Response, its Data and its EndOfMessage: with the
        # request read or still being read, only ours moves, to DONE (no writer there).
        conn.client_is_waiting_for_100_continue = False
        if conn.their_state is h11.DONE or conn.their_state is h11.SEND_BODY:
            state.states[h11.SERVER] = h11.DONE
            conn._writer = None  # noqa: SLF001  # as h11 drops its writer on reaching DONE
        else:
            before = dict(state.states)
            state.process_event(h11.SERVER, h11.Response)
            state.process_event(h11.SERVER, h11.EndOfMessage)
            conn._respond_to_state_changes(before)  # noqa: SLF001  # h11's own step after its sends
        # uvicorn's end of a response.
        cycle.response_complete = True
        cycle.message_event.set()
        if state.states[h11.SERVER] is h11.MUST_CLOSE:
            conn.send(h11.ConnectionClosed())
            cycle.transport.close()
        cycle.on_response()
        return True


class Clients:
    """One server's open connections by client address, each address's oldest first."""

    def __init__(self) -> None:
        self.total = 0
        self._by_address: dict[str, dict[GuardedH11Protocol, None]] = {}

    def add(self, address: str, connection: GuardedH11Protocol) -> int:
        """Count ``connection``; how many ``address`` has now."""
        mine = self._by_address.setdefault(address, {})
        mine[connection] = None
        self.total += 1
        return len(mine)

    def remove(self, address: str, connection: GuardedH11Protocol) -> None:
        mine = self._by_address.get(address)
        if mine is not None and mine.pop(connection, False) is None:
            self.total -= 1
            if not mine:
                del self._by_address[address]

    def count(self, address: str) -> int:
        return len(self._by_address.get(address, ()))

    def evictable(self, newcomer: GuardedH11Protocol, now: float) -> GuardedH11Protocol | None:
        """Of the address with the most connections (the next one when that one has none to
        give), the oldest idle connection but ``newcomer``, else the one whose body is furthest
        behind the minimum rate; None when every connection is busy and keeping pace."""
        for address in sorted(self._by_address, key=lambda a: len(self._by_address[a]), reverse=True):
            slowest, furthest = None, 0.0
            for connection in self._by_address[address]:
                if connection is newcomer:
                    continue
                if connection.idle():
                    return connection
                behind = connection.behind(now)
                if behind > furthest:
                    slowest, furthest = connection, behind
            if slowest is not None:
                return slowest
        return None


def protocol_factory(bounds: ConnectionLimits) -> Callable[..., GuardedH11Protocol]:
    """What uvicorn's ``http`` setting takes: one shared table of connections per client."""
    return functools.partial(GuardedH11Protocol, bounds=bounds, clients=Clients())


def refusal(err: ACPError) -> bytes:
    """A whole HTTP/1.1 response carrying ``err`` as an envelope, closing the connection."""
    request_id = envelope.new_request_id()
    status = http_status(err.code)
    body = orjson.dumps(envelope.error(versions.CURRENT, request_id, err, 0.0))
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        f"x-request-id: {request_id}\r\n"
        f"acp-version: {versions.CURRENT}\r\n"
        "cache-control: no-store\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class GuardedH11Protocol(H11Protocol):
    """One HTTP/1.1 connection, bounded (the module's docstring)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        bounds: ConnectionLimits,
        clients: Clients,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.bounds = bounds
        self.clients = clients
        self._client_key: str | None = None
        # The deadline (loop time) and the one timer that checks it: re-arming per request
        # only moves ``_due``; the timer, when it fires early, waits again for the rest.
        self._due: float | None = None
        # After an answer the deadline is first the idle one (``timeout_keep_alive``, the
        # close uvicorn would time with a timer of its own per response); a request begun
        # by then has until this one to send its headers.
        self._headers_due: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._in_body = False
        # The body under way: when its headers ended (loop time; restarted when the server
        # stopped reading it), the bytes received since, and when its body timeout falls.
        self._body_began = 0.0
        self._body_bytes = 0
        self._body_due = 0.0
        # Read by its transport (``_Lingering``) too. Bytes dropped since a refusal (0: not
        # refused); the connection is gone (``connection_lost``).
        self.draining = 0
        self.lost = False
        # The task running the application for the current request, and one this connection
        # cancelled because its client left before the answer (``connection_lost``).
        self._app = self.app
        self.app = self._run_app
        self._app_task: asyncio.Task[Any] | None = None
        self._abandoned: asyncio.Task[Any] | None = None

    # connection ---------------------------------------------------------------------

    transport: _Lingering  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(cast(asyncio.Transport, _Lingering(transport, self)))
        self._client_key = key = self.client[0] if self.client else ""
        clients = self.clients
        # A refused newcomer never holds a place, not even while it lingers.
        if clients.add(key, self) > self.bounds.max_connections_per_client:
            self._forget()
            self._refuse(self._too_many("one client address", self.bounds.max_connections_per_client))
            return
        if clients.total > self.bounds.max_connections:
            evicted = clients.evictable(self, self.loop.time())
            if evicted is None:
                self._forget()
                self._refuse(self._too_many("the server", self.bounds.max_connections))
                return
            evicted.evict()
        self._arm(self.bounds.header_timeout)

    def idle(self) -> bool:
        """No request under way (none sent yet, or between two): closing loses nothing."""
        return (
            self._app_task is None
            and self.conn.their_state is h11.IDLE
            and not (self.draining or self.lost or self.transport.is_closing())
        )

    def behind(self, now: float) -> float:
        """How many bytes the body under way is short of the minimum rate since its headers
        (0 when none is under way, or the server stopped reading it)."""
        if not self._in_body or self.flow.read_paused or self.draining or self.lost:
            return 0.0
        return max(0.0, self.bounds.min_body_rate * (now - self._body_began) - self._body_bytes)

    def evict(self) -> None:
        """Close, to make room for a newcomer: uncounted at once (the close may take a turn);
        a body under way is answered first."""
        self._forget()
        if self._in_body:
            self._refuse(self._too_slow())
        else:
            self.transport.close()

    def _forget(self) -> None:
        if self._client_key is not None:
            self.clients.remove(self._client_key, self)
            self._client_key = None

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._disarm()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._forget()
        super().connection_lost(exc)
        task = self._app_task
        if task is not None and self.cycle is not None and not self.cycle.response_started:
            # The client left before its answer: the call stops waiting, as on a gRPC
            # deadline (what its work does then: docs/server.md, "Deadlines and disconnects").
            self._abandoned = task
            task.cancel()

    async def _run_app(self, scope: Any, receive: Any, send: Any) -> None:
        """The application, in the task ``connection_lost`` may cancel; that cancellation
        ends here quietly (uvicorn would log it as an error)."""
        task = asyncio.current_task()
        self._app_task = task
        cycle = getattr(send, "__self__", None)
        if isinstance(cycle, RequestResponseCycle):
            send = _Answering(self, cycle)
        try:
            await self._app(scope, receive, send)
        except asyncio.CancelledError:
            if task is None:
                raise
            if self._abandoned is not task:
                # Only uvicorn's shutdown, past its graceful timeout, cancels it otherwise:
                # an envelope rather than its plain-text 500 (the facade's cut, earlier,
                # answers with what the call did; here that is not known).
                if not isinstance(cycle, RequestResponseCycle) or cycle.response_started:
                    raise
                self._cut(scope, cycle)
            task.uncancel()
        finally:
            if self._app_task is task:
                self._app_task = None

    def _cut(self, scope: Any, cycle: RequestResponseCycle) -> None:
        """Answer a request the stopping server cut before its answer began, and close
        (``disconnected``: uvicorn adds no answer of its own)."""
        cycle.disconnected = True
        if self.transport.is_closing():
            return
        method = scope.get("method", "") if isinstance(scope, dict) else ""
        path = scope.get("path", "") if isinstance(scope, dict) else ""
        self.transport.write(refusal(server_stopping(f"{method} {path}".strip(), "", "unknown")))
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.draining:
            self.draining += len(data)
            if self.draining > _LINGER_BYTES:
                self.transport.close()
            return
        if self._in_body:
            self._body_bytes += len(data)
        super().data_received(data)
        self._follow()

    # request phases -----------------------------------------------------------------

    def _follow(self) -> None:
        """Re-arm the deadline as the request moves on: headers done, body done."""
        if self.draining or self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY and not self._in_body:
            self._in_body = True
            now = self.loop.time()
            self._body_began, self._body_bytes = now, 0
            self._body_due = now + self.bounds.body_timeout
            self._arm(min(self.bounds.body_timeout, self.bounds.min_body_rate_grace))
        elif state is not h11.IDLE and state is not h11.SEND_BODY:
            self._in_body = False
            self._disarm()

    def on_response_complete(self) -> None:
        """uvicorn's, except for its keep-alive timer (a TimerHandle made and cancelled per
        response): the connection's deadline closes it once idle."""
        self.server_state.total_requests += 1
        self._in_body = False
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self._arm(self.timeout_keep_alive)
        self._headers_due = cast(float, self._due) + self.bounds.header_timeout
        self.flow.resume_reading()
        # Unblock a pipelined request (nothing received yet: the next data_received reads it).
        if self.conn.our_state is h11.DONE and self.conn.their_state is h11.DONE:
            self.conn.start_next_cycle()
            if self.conn.trailing_data[0]:
                self.handle_events()
        self._follow()

    def _arm(self, seconds: float) -> None:
        self._headers_due = None
        due = self._due = self.loop.time() + seconds
        timer = self._timer
        if timer is not None:
            if timer.when() <= due:
                return
            timer.cancel()
        self._timer = self.loop.call_at(due, self._check)

    def _disarm(self) -> None:
        self._due = None
        self._headers_due = None

    def _check(self) -> None:
        self._timer = None
        due = self._due
        if due is None:
            return
        if self.loop.time() < due:
            self._timer = self.loop.call_at(due, self._check)
            return
        self._due = None
        self._expired()

    def _expired(self) -> None:
        """The deadline passed: a request still incomplete is refused (one begun while the
        connection was idle has until ``_headers_due``); a connection that sent nothing since
        its last response (or at all) is closed."""
        if self.transport.is_closing() or self.draining:
            return
        state = self.conn.their_state
        if state is h11.IDLE and not self.conn.trailing_data[0]:
            self.transport.close()
        elif state is h11.IDLE and self._headers_due is not None:
            self._due, self._headers_due = self._headers_due, None
            self._timer = self.loop.call_at(self._due, self._check)
        elif state is h11.SEND_BODY and (self.loop.time() < self._body_due or self.flow.read_paused):
            self._pace()
        elif state is h11.IDLE or state is h11.SEND_BODY:
            headers = state is h11.IDLE
            seconds = self.bounds.header_timeout if headers else self.bounds.body_timeout
            self._refuse(
                ACPError(
                    ErrorCode.INVALID_PARAMS,
                    f"the request did not send its {'headers' if headers else 'body'} within {seconds:g} s",
                    {"field": "request", "timeout_seconds": seconds},
                    refinement="REQUEST_TIMEOUT",
                )
            )

    def _pace(self) -> None:
        """Past the grace, before the body timeout: refuse a body behind the minimum rate,
        else check again when it would fall behind (a second from now at the soonest). While
        the server does not read (a large body waiting for its place), the rate and the body
        timeout start over: the server is the slow one."""
        now = self.loop.time()
        if self.flow.read_paused:
            self._body_began, self._body_bytes = now, 0
            self._body_due = max(self._body_due, now + self.bounds.body_timeout)
        elif now >= self._body_began + self.bounds.min_body_rate_grace and self.behind(now) > 0:
            self._refuse(self._too_slow())
            return
        rate = self.bounds.min_body_rate
        grace = self._body_began + self.bounds.min_body_rate_grace
        behind_at = max(grace, self._body_began + self._body_bytes / rate if rate > 0 else self._body_due)
        self._due = min(self._body_due, max(behind_at, now + 1.0))
        self._timer = self.loop.call_at(self._due, self._check)

    # refusals -----------------------------------------------------------------------

    def _too_slow(self) -> ACPError:
        rate = self.bounds.min_body_rate
        return ACPError(
            ErrorCode.INVALID_PARAMS,
            f"the request's body arrives slower than {rate} bytes a second",
            {"field": "request", "min_bytes_per_second": rate},
            refinement="REQUEST_TIMEOUT",
        )

    def _too_many(self, scope: str, limit: int) -> ACPError:
        return ACPError(
            ErrorCode.BUDGET_EXCEEDED,
            f"too many open connections to {scope}; the limit is {limit}",
            {"max_connections": limit},
            refinement="TOO_MANY_CONNECTIONS",
        )

    def _headers_too_large(self) -> ACPError:
        limit = self.bounds.max_header_bytes
        return ACPError(
            ErrorCode.INVALID_PARAMS,
            f"the request's headers are over the limit of {limit} bytes",
            {"field": "headers", "max_bytes": limit},
        )

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot read: an envelope instead."""
        if len(self.conn.trailing_data[0]) > self.bounds.max_header_bytes:
            self._refuse(self._headers_too_large())
            return
        self._refuse(
            ACPError(ErrorCode.INVALID_PARAMS, "the request is not valid HTTP/1.1", {"field": "request"})
        )

    def _refuse(self, err: ACPError) -> None:
        """Answer ``err`` (unless a response already began), drain for a moment, close."""
        self._disarm()
        answered = False
        if self.cycle is not None and not self.cycle.response_complete:
            answered = self.cycle.response_started
            # The application reading the body sees the client leave and answers nothing.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        if not answered:
            self.transport.write(refusal(err))
        self.linger()

    def linger(self) -> None:
        """Drop what the client still sends, for ``_LINGER_SECONDS`` and ``_LINGER_BYTES`` at
        most, then close: the client reads the answer instead of a reset."""
        self._disarm()
        self.draining = 1
        self.flow.resume_reading()
        self.loop.call_later(_LINGER_SECONDS, self.transport.close)
