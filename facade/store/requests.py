"""Request ids: what a store keeps so a retried call is answered, not run again.

A mutating call that carries a client's request id runs under a ``Claim`` (set in the
``CLAIM`` context variable by the facade's idempotency layer). Every store method that
writes (``insert``, ``update``, ``delete``, items, events) calls ``Store.note_claim``,
which stamps the claim's row in the *same transaction* as the write: the row exists
exactly when the effect committed, and it holds the entity records the call wrote, as
they were. A server killed after that commit and before the answer was sent finds the
row on restart and rebuilds the answer from those records instead of running the call
again (docs/idempotency.md). The store knows no domain: it keeps bytes by key.
"""

from __future__ import annotations

import asyncio
import struct
from contextvars import ContextVar
from dataclasses import dataclass, field


class RequestClaimedError(Exception):
    """Another live claim (another server process) stamped this request id first: the
    write that noticed it is rolled back, so the call has no effect here."""


@dataclass
class RequestEntry:
    """One stored request id of one principal."""

    principal: str
    request_id: str
    operation: str
    # sha256 of the operation and its request's deterministic bytes: a reuse check.
    digest: bytes
    # The claim that stamped it (a ULID per run): two processes never both own it.
    owner: str
    # Seconds since the epoch the first run started: retention counts from here.
    time: float
    # The answer as stored: response bytes, or an error's JSON when ``error``; None while
    # the answer is the one ``written`` rebuilds (or the run has not ended).
    answer: bytes | None = None
    error: bool = False
    # (kind, id) -> the record's body as the call last wrote it (deleted: as it was).
    written: dict[tuple[str, str], bytes] = field(default_factory=dict)


@dataclass
class Claim:
    """A call running under a request id; the store stamps ``entry`` with what it writes."""

    entry: RequestEntry
    # Rows older than this (seconds since the epoch) are past retention: a stamp replaces them.
    cutoff: float
    # False once the call ended: work it left running in the background stamps nothing.
    open: bool = True
    # Whether a write under the claim reached the store (it may have been rolled back).
    stamped: bool = False
    # Whether a write found another live claim's row (and was rolled back).
    conflict: bool = False
    # One event per write made under the claim, set once it committed or failed: a call cut
    # by a stopping server waits for them before it says whether it took effect.
    pending: list[asyncio.Event] = field(default_factory=list)


CLAIM: ContextVar[Claim | None] = ContextVar("acp_request_claim", default=None)


def encode_written(written: dict[tuple[str, str], bytes]) -> bytes:
    """The records a claim wrote as one blob: (kind, id, body) length-prefixed, in order."""
    parts = []
    for (kind, id_), body in written.items():
        for piece in (kind.encode(), id_.encode(), body):
            parts.append(struct.pack(">I", len(piece)))
            parts.append(piece)
    return b"".join(parts)


def decode_written(blob: bytes | None) -> dict[tuple[str, str], bytes]:
    written: dict[tuple[str, str], bytes] = {}
    if not blob:
        return written
    view = memoryview(blob)
    at = 0
    pieces: list[bytes] = []
    while at < len(view):
        (size,) = struct.unpack_from(">I", view, at)
        at += 4
        pieces.append(bytes(view[at : at + size]))
        at += size
        if len(pieces) == 3:
            written[(pieces[0].decode(), pieces[1].decode())] = pieces[2]
            pieces = []
    return written
