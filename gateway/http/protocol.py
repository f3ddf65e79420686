"""uvicorn's HTTP/1.1 protocol on httptools (llhttp) with the bounds the gateway needs below
the application: header size, time to send a request, connections in all and per client.

uvicorn refuses a malformed request with a plain-text 400, has no bound on a request's head
(httptools keeps a header that never ends), no time limit on a request that trickles in, and
no per-client cap. Here each refusal is an ACP envelope, written by the protocol itself since
no request reaches the application:

- headers over ``max_header_bytes`` (the bytes received while a head is incomplete; a head
  that came whole in a read over the limit, by its request line and header lines):
  INVALID_PARAMS (``details.field`` ``headers``); any other unreadable request:
  INVALID_PARAMS (``field`` ``request``), but a method httptools does not know (h11 took any
  token): NOT_FOUND, as the application answers a method no route serves (``details.path``,
  ``method``);
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
  way: never sent one, or between two; a head not yet whole is none yet), else the body
  furthest behind the minimum rate (no grace here: the server is full), refused as above.
  Only when no connection is idle or behind is the newcomer refused as above. 2,100 slow
  connections from 9 addresses once got 20 of 25 legitimate newcomers refused, and 40
  trickled bodies from 4 addresses 5 of 5; now they lose their own connections first.

After a refusal the connection reads and drops what the client still sends for a moment
before closing, so the client sees the answer instead of a reset. So does any close while the
client is still sending its request body (nginx's "lingering close"): the application answers a
body over ``--max-body-bytes`` at once, from its declared length, and a client that asked for
``Connection: close`` (urllib does) would otherwise get a reset while it sends, before it reads.

A client that drops its connection before its answer began ends the call's wait: the request's
application task is cancelled, as gRPC cancels a call whose deadline passed (what the call's
work does then is the operation's ``when_abandoned``: docs/server.md, "Deadlines and disconnects").

An answer whose head declares its length (every envelope, every plain Starlette response)
leaves in one send: uvicorn writes its head and its body with a write each, and the head is
held until the body's write takes it along (``_Transport``). The bytes are uvicorn's.

The phase of the request being read (``_IDLE``, ``_HEAD``, ``_BODY``, ``_DONE``) is followed
from httptools' callbacks; uvicorn's own keep-alive timer (one made and cancelled per response)
is replaced by the connection's one deadline.
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import httptools
import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

from cleveragents.acp.contract import envelope, limits, versions
from cleveragents.acp.contract.errors import ACPError, ErrorCode, http_status
from cleveragents.acp.contract.stopping import server_stopping

# How long a refused connection keeps draining what the client still sends, and how much.
_LINGER_SECONDS = 2.0
_LINGER_BYTES = 16 * 1024 * 1024

# The phase of the request the parser reads: none begun since the last one (or since the
# connection), its head under way, its body under way, read whole (its answer pending).
_IDLE, _HEAD, _BODY, _DONE = "idle", "head", "body", "done"


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


class _Transport:
    """The connection's transport as uvicorn sees it: an answer's head held until its body
    (one send), and a ``close`` while the client is still sending its request body lingers
    instead (``GuardedProtocol.linger``).

    uvicorn writes a response's head and its body with a ``write`` each: two sends, two
    segments, two wake-ups of the client. A head that declares a length (uvicorn's cycle then
    expects that many bytes: every envelope, every plain Starlette response) is held here
    until the next write, which takes it along, or a close; any other head (a stream's)
    leaves at once."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedProtocol) -> None:
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
        cycle = self._protocol.cycle
        if (
            cycle is not self._headed
            and cycle.response_started
            and cycle.chunked_encoding is False
            and cycle.expected_content_length
            and not cycle.response_complete
            and cycle.scope["method"] != "HEAD"
        ):
            self._headed = cycle
            self._held = data
            return
        self._transport.write(data)

    def flush(self) -> None:
        """Send a held head."""
        held = self._held
        if held is not None:
            self._held = None
            if not self._protocol.lost:
                self._transport.write(held)

    def close(self) -> None:
        self.flush()
        protocol = self._protocol
        sending = protocol.phase is _BODY
        if sending and not (protocol.draining or protocol.lost or self._transport.is_closing()):
            protocol.linger()
        else:
            self._transport.close()

    def is_closing(self) -> bool:
        """Closing once lingering: uvicorn arms no keep-alive and reads no next request."""
        return bool(self._protocol.draining) or self._transport.is_closing()


class Clients:
    """One server's open connections by client address, each address's oldest first."""

    def __init__(self) -> None:
        self.total = 0
        self._by_address: dict[str, dict[GuardedProtocol, None]] = {}

    def add(self, address: str, connection: GuardedProtocol) -> int:
        """Count ``connection``; how many ``address`` has now."""
        mine = self._by_address.setdefault(address, {})
        mine[connection] = None
        self.total += 1
        return len(mine)

    def remove(self, address: str, connection: GuardedProtocol) -> None:
        mine = self._by_address.get(address)
        if mine is not None and mine.pop(connection, False) is None:
            self.total -= 1
            if not mine:
                del self._by_address[address]

    def count(self, address: str) -> int:
        return len(self._by_address.get(address, ()))

    def evictable(self, newcomer: GuardedProtocol, now: float) -> GuardedProtocol | None:
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


def protocol_factory(bounds: ConnectionLimits) -> Callable[..., GuardedProtocol]:
    """What uvicorn's ``http`` setting takes: one shared table of connections per client."""
    return functools.partial(GuardedProtocol, bounds=bounds, clients=Clients())


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


# A request line's method and target, as far as this module reads one (``_unknown_method``).
_REQUEST_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]{1,32}) (/[!-~]{0,2048}) HTTP/1\.[01]")


def _unknown_method(line: bytes) -> ACPError:
    """The answer to a request whose method httptools does not know, from its request line
    (empty when not at hand): NOT_FOUND, as the application answers a method no route
    serves; an unreadable line is an unreadable request."""
    found = _REQUEST_LINE.fullmatch(line)
    if found is None:
        return _unreadable()
    method = found[1].decode("ascii")
    path = unquote(found[2].decode("ascii").split("?", 1)[0])
    return ACPError(
        ErrorCode.NOT_FOUND, f"{method} is not served on {path}", {"path": path, "method": method}
    )


def _unreadable() -> ACPError:
    return ACPError(ErrorCode.INVALID_PARAMS, "the request is not valid HTTP/1.1", {"field": "request"})


class _HeadersTooLargeError(Exception):
    """Raised in a parser callback: httptools stops, uvicorn calls ``send_400_response``."""


class GuardedProtocol(HttpToolsProtocol):
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
        # The phase of the request the parser reads, and the bytes received since the last
        # request's headers ended while the next one's were not (a head httptools still
        # holds, or one that came in the same read as its end).
        self.phase = _IDLE
        self._unparsed = 0
        self._too_large = False
        self._in_body = False
        # The body under way: when its headers ended (loop time; restarted when the server
        # stopped reading it), the bytes received since, and when its body timeout falls.
        self._body_began = 0.0
        self._body_bytes = 0
        self._body_due = 0.0
        # Read by its transport (``_Transport``) too. Bytes dropped since a refusal (0: not
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

    transport: _Transport  # type: ignore[assignment]

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(_Transport(transport, self))  # type: ignore[arg-type]
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
        """No request under way (none sent yet, or between two; a head not yet whole is no
        request yet): closing loses nothing."""
        phase = self.phase
        return (
            self._app_task is None
            and (phase is _IDLE or phase is _HEAD)
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
        phase = self.phase
        if phase is _BODY:
            if self._in_body:
                self._body_bytes += len(data)
        elif phase is not _DONE:
            self._unparsed += len(data)
        # uvicorn's ``data_received`` (its keep-alive timer is never set here), except for a
        # method httptools does not know: h11 took any token, and the application answers a
        # method no route serves with NOT_FOUND; so does this.
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserInvalidMethodError:
            line = data.split(b"\r\n", 1)[0] if phase is _IDLE and self._unparsed == len(data) else b""
            self._refuse(_unknown_method(line))
            return
        except httptools.HttpParserError:
            self.logger.warning("Invalid HTTP request received.")
            self.send_400_response("Invalid HTTP request received.")
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        phase = self.phase
        if phase is _BODY:
            if not self._in_body and not (self.draining or self.transport.is_closing()):
                self._begin_body()
        elif (
            phase is not _DONE
            and self._unparsed > self.bounds.max_header_bytes
            and not (self.draining or self.transport.is_closing())
        ):
            self._refuse(self._headers_too_large())

    # request phases (httptools' callbacks) --------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.phase = _HEAD

    def on_headers_complete(self) -> None:
        self.phase = _BODY
        limit = self.bounds.max_header_bytes
        if self._unparsed > limit:
            # A head that came whole with more than the limit (in one read): its own size.
            size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
            if size > limit:
                self._too_large = True
                raise _HeadersTooLargeError
        self._unparsed = 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_body = False
        cycle = self.cycle
        if cycle is not None and cycle.response_complete:
            # Answered before its body was all read (the rest was dropped): idle now.
            self.phase = _IDLE
            if not self.transport.is_closing():
                self._idle_deadline()
        else:
            self.phase = _DONE
            self._due = self._headers_due = None  # _disarm, on every request's path

    def _begin_body(self) -> None:
        self._in_body = True
        now = self.loop.time()
        self._body_began, self._body_bytes = now, 0
        self._body_due = now + self.bounds.body_timeout
        self._arm(min(self.bounds.body_timeout, self.bounds.min_body_rate_grace))

    def on_response_complete(self) -> None:
        """uvicorn's, except for its keep-alive timer (a TimerHandle made and cancelled per
        response): the connection's deadline closes it once idle."""
        self.server_state.total_requests += 1
        self._in_body = False
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            if self.phase is _DONE:
                self.phase = _IDLE
            self._headers_due = self._arm(self.timeout_keep_alive) + self.bounds.header_timeout
        if self.phase is _BODY and not self.draining:
            # Answered while its body still comes: the rest keeps its own pace.
            self._begin_body()

    def _idle_deadline(self) -> None:
        self._headers_due = self._arm(self.timeout_keep_alive) + self.bounds.header_timeout

    def _arm(self, seconds: float) -> float:
        """Move the deadline to ``seconds`` from now; the deadline."""
        self._headers_due = None
        due = self._due = self.loop.time() + seconds
        timer = self._timer
        if timer is not None:
            if timer.when() <= due:
                return due
            timer.cancel()
        self._timer = self.loop.call_at(due, self._check)
        return due

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
        phase = self.phase
        if phase is _IDLE:
            self.transport.close()
        elif phase is _HEAD and self._headers_due is not None:
            self._due, self._headers_due = self._headers_due, None
            self._timer = self.loop.call_at(self._due, self._check)
        elif phase is _BODY and (self.loop.time() < self._body_due or self.flow.read_paused):
            self._pace()
        elif phase is _HEAD or phase is _BODY:
            headers = phase is _HEAD
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
        """uvicorn's answer to a request httptools cannot read: an envelope instead."""
        if self._too_large:
            self._refuse(self._headers_too_large())
            return
        self._refuse(_unreadable())

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
