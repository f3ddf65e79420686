"""Connection bounds of the gRPC port, the HTTP port's policy (``gateway/http/protocol.py``)
as far as grpcio allows.

~20,000 unauthenticated idle HTTP/2 connections once used up the server's file descriptors
and both ports stopped answering. grpcio's C core accepts connections itself, so:

- the core's own options bound connections in all (``max_connections``), the handshake
  (``header_timeout``), an idle connection (no call for ``GRPC_IDLE_SECONDS``) and a
  connection's age (``GRPC_AGE_SECONDS``, calls under way finish first), and ping abuse;
- grpcio has no per-client cap and no hook at accept, so ``ConnectionGuard`` sweeps the
  process's own sockets on the port every ``SWEEP_SECONDS`` (``/proc/self/fd`` and
  ``/proc/self/net/tcp*``, on a thread) and shuts down, with ``shutdown(2)`` on a duplicate
  of the core's descriptor, what is over the policy: past ``max_connections_per_client``
  from one address, its newest connections that never carried an authenticated call; and
  connections that never carried one past 7/8 of ``max_connections`` (room kept for clients
  that did), the oldest of the address holding the most first. The core sees its peer
  leave and frees the connection. Connections that carried an authenticated call (``saw``)
  are left alone: they answer to the idle and age limits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

from cleveragents.acp.gateway.http.protocol import ConnectionLimits

log = logging.getLogger(__name__)

GRPC_IDLE_SECONDS = 60
GRPC_AGE_SECONDS = 3600
SWEEP_SECONDS = 1.0
_ESTABLISHED = "01"


def options(bounds: ConnectionLimits) -> list[tuple[str, int]]:
    """The gRPC core's connection options for ``bounds``."""
    return [
        ("grpc.max_allowed_incoming_connections", bounds.max_connections),
        ("grpc.server_handshake_timeout_ms", int(bounds.header_timeout * 1000)),
        ("grpc.max_connection_idle_ms", GRPC_IDLE_SECONDS * 1000),
        ("grpc.max_connection_age_ms", GRPC_AGE_SECONDS * 1000),
        # A client pinging more often than the core allows is told GOAWAY at its 2nd strike.
        ("grpc.http2.max_ping_strikes", 2),
    ]


@dataclass(frozen=True)
class _Connection:
    inode: int
    fd: int
    peer: str  # "address:port", as grpc's context.peer() ends
    address: str


def _peer(hex_address: str) -> tuple[str, int]:
    """An address of /proc/net/tcp (``0100007F:1F90``; IPv6 as four host-order words)."""
    host, _, port = hex_address.partition(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        return socket.inet_ntop(socket.AF_INET, raw[::-1]), int(port, 16)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words), int(port, 16)


def _socket_fds() -> dict[int, int]:
    """This process's sockets: inode -> descriptor."""
    found: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                target = os.readlink(f"/proc/self/fd/{name}")
                if target.startswith("socket:["):
                    found[int(target[8:-1])] = int(name)
    return found


def _connections(port: int) -> Iterator[_Connection]:
    """This process's established connections to local ``port``, oldest (lowest inode) first."""
    fds = _socket_fds()
    rows = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines, None)
            for line in lines:
                fields = line.split()
                if len(fields) < 10 or fields[3] != _ESTABLISHED:
                    continue
                inode = int(fields[9])
                if inode not in fds or _peer(fields[1])[1] != port:
                    continue
                address, remote_port = _peer(fields[2])
                if address.startswith("::ffff:"):
                    address = address[7:]
                rows.append(_Connection(inode, fds[inode], f"{address}:{remote_port}", address))
    yield from sorted(rows, key=lambda c: c.inode)


def _shut(connection: _Connection) -> bool:
    """Shut the core's socket down, if its descriptor is still that socket."""
    try:
        duplicate = os.dup(connection.fd)
    except OSError:
        return False
    try:
        if os.fstat(duplicate).st_ino != connection.inode:
            return False
        with socket.socket(fileno=duplicate) as sock:
            duplicate = -1
            sock.shutdown(socket.SHUT_RDWR)
        return True
    except OSError:
        return False
    finally:
        if duplicate >= 0:
            os.close(duplicate)


class ConnectionGuard:
    """The per-client and room-keeping sweeps of one gRPC port (the module's docstring)."""

    def __init__(self, bounds: ConnectionLimits) -> None:
        self.bounds = bounds
        self.port = 0
        # Peers ("address:port") that carried a call, pruned to the open connections.
        self._called: set[str] = set()

    def saw(self, peer: str) -> None:
        """An authenticated call arrived from ``peer`` (grpc's ``context.peer()``:
        ``ipv4:1.2.3.4:5``)."""
        kind, _, rest = peer.partition(":")
        if kind == "ipv6":
            rest = rest.replace("[", "").replace("]", "").replace("%25", "%")
        self._called.add(rest)

    def sweep(self) -> list[str]:
        """One sweep; the peers it shut down."""
        if not self.port:
            return []
        connections = list(_connections(self.port))
        self._called &= {c.peer for c in connections}
        uncalled = [c for c in connections if c.peer not in self._called]
        by_address: dict[str, list[_Connection]] = {}
        for connection in connections:
            by_address.setdefault(connection.address, []).append(connection)
        doomed: dict[int, _Connection] = {}
        cap = self.bounds.max_connections_per_client
        for mine in by_address.values():
            excess = len(mine) - cap
            for connection in reversed(mine):
                if excess <= 0:
                    break
                if connection.peer not in self._called:
                    doomed[connection.inode] = connection
                    excess -= 1
        room = self.bounds.max_connections - self.bounds.max_connections // 8
        left = [c for c in uncalled if c.inode not in doomed]
        while len(left) > room:
            counts: dict[str, int] = {}
            for connection in left:
                counts[connection.address] = counts.get(connection.address, 0) + 1
            most = max(counts, key=lambda a: counts[a])
            oldest = next(c for c in left if c.address == most)
            doomed[oldest.inode] = oldest
            left.remove(oldest)
        return [c.peer for c in doomed.values() if _shut(c)]

    async def run(self) -> None:
        """Sweep until cancelled."""
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            try:
                shut = await asyncio.to_thread(self.sweep)
            except Exception:
                log.exception("the gRPC connection sweep failed")
                continue
            if shut:
                log.warning("shut down %d gRPC connections over the connection policy", len(shut))
