"""One webhook request: POST to the address the egress rules checked, and nothing else.

The host is resolved and checked (``egress.WebhookEgress.resolve``) immediately before the
connection, which is opened to that very address (TLS still verifies the URL's host name),
so a DNS answer that changes between check and use cannot redirect it. Redirects are not
followed (a 3xx is a failed delivery saying where it pointed). Connecting, and the whole
exchange, are bounded in time; the answer is read up to its headers and the first
``EXCERPT_BYTES`` of its body, then the connection is closed: a receiver cannot make the
server read (or hold) more than that. Everything here awaits: nothing blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass

from cleveragents.acp.facade.domain.access.webhook_egress import AddressRefusedError, Target, WebhookEgress

# What is kept of a receiver's answer, and the most its status line and headers may take.
EXCERPT_BYTES = 1024
MAX_HEAD_BYTES = 16 * 1024
USER_AGENT = "cleveragents-acp-webhooks/1"


@dataclass(frozen=True)
class Limits:
    connect_seconds: float = 5.0
    # The whole request, from the lookup to the last byte read.
    total_seconds: float = 15.0


@dataclass(frozen=True)
class Outcome:
    # 0: no answer (refused, unreachable, timed out).
    status: int = 0
    excerpt: str = ""
    error: str = ""
    # The address checks refused the URL (nothing was sent).
    refused: bool = False
    latency_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


_TLS: ssl.SSLContext | None = None


def _tls() -> ssl.SSLContext:
    global _TLS
    if _TLS is None:
        _TLS = ssl.create_default_context()
    return _TLS


async def post(
    egress: WebhookEgress,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    limits: Limits,
    *,
    tls: ssl.SSLContext | None = None,
) -> Outcome:
    started = time.perf_counter()
    try:
        async with asyncio.timeout(limits.total_seconds):
            outcome = await _post(egress, url, headers, body, limits, tls)
    except AddressRefusedError as exc:
        outcome = Outcome(error=str(exc), refused=True)
    except TimeoutError:
        outcome = Outcome(error=f"no answer within {limits.total_seconds:g} s")
    except (OSError, ssl.SSLError, ValueError) as exc:
        outcome = Outcome(error=f"{type(exc).__name__}: {exc}"[:300])
    latency = (time.perf_counter() - started) * 1000
    return Outcome(outcome.status, outcome.excerpt, outcome.error, outcome.refused, latency)


async def _post(
    egress: WebhookEgress,
    url: str,
    headers: Mapping[str, str],
    body: bytes,
    limits: Limits,
    tls: ssl.SSLContext | None,
) -> Outcome:
    target = egress.check_url(url)
    address = await egress.resolve(target)
    secure = target.scheme == "https"
    try:
        async with asyncio.timeout(limits.connect_seconds):
            reader, writer = await asyncio.open_connection(
                str(address),
                target.port,
                ssl=(tls or _tls()) if secure else None,
                server_hostname=target.host if secure else None,
                limit=MAX_HEAD_BYTES,
            )
    except TimeoutError:
        return Outcome(error=f"could not connect within {limits.connect_seconds:g} s")
    try:
        writer.write(_request(target, headers, body))
        await writer.drain()
        return await _answer(reader)
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()


def _request(target: Target, headers: Mapping[str, str], body: bytes) -> bytes:
    lines = [
        f"POST {target.target} HTTP/1.1",
        f"Host: {target.host_header}",
        f"User-Agent: {USER_AGENT}",
        "Content-Type: application/json",
        f"Content-Length: {len(body)}",
        "Connection: close",
    ]
    lines.extend(f"{name}: {value}" for name, value in headers.items())
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


async def _answer(reader: asyncio.StreamReader) -> Outcome:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        return Outcome(error=f"the answer's headers exceed {MAX_HEAD_BYTES} bytes")
    except asyncio.IncompleteReadError:
        return Outcome(error="the receiver closed the connection without an answer")
    status_line, _, rest = head.decode("latin-1").partition("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        return Outcome(error=f"not an HTTP answer: {status_line[:80]!r}")
    status = int(parts[1])
    fields = _fields(rest)
    excerpt = await _excerpt(reader, fields)
    if 300 <= status < 400:
        where = fields.get("location", "")[:200]
        return Outcome(status, excerpt, f"redirects are not followed (HTTP {status} to {where!r})")
    if not 200 <= status < 300:
        return Outcome(status, excerpt, f"HTTP {status}")
    return Outcome(status, excerpt)


def _fields(head: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in head.split("\r\n"):
        name, sep, value = line.partition(":")
        if sep:
            found[name.strip().lower()] = value.strip()
    return found


async def _excerpt(reader: asyncio.StreamReader, fields: Mapping[str, str]) -> str:
    """The first bytes of the body (a chunked one's first chunk's), never more."""
    length = fields.get("content-length", "")
    want = min(int(length), EXCERPT_BYTES) if length.isdigit() else EXCERPT_BYTES
    if want <= 0:
        return ""
    chunked = "chunked" in fields.get("transfer-encoding", "").lower()
    data = b""
    with contextlib.suppress(
        asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError, TimeoutError, ValueError
    ):
        async with asyncio.timeout(1.0):
            if chunked:
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                want = min(size, EXCERPT_BYTES)
            while len(data) < want:
                piece = await reader.read(want - len(data))
                if not piece:
                    break
                data += piece
    return data[:EXCERPT_BYTES].decode("utf-8", "replace")
