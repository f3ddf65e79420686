"""The acknowledged-writes ledger of the fault-injection suite (``make chaos``; a bounded run
in ``make test``).

Writers tell messages to sessions of their own through real ACP clients (HTTP or gRPC, the
default ``RetryPolicy``: what a user's client rides out, it rides out here) while a case
injects its fault. Each call's outcome is written down: acknowledged, refused saying its effect
(``details.effect`` ``applied`` / ``none``, contract/stopping.py; STORE_DISK_FULL says none;
REQUEST_ANSWER_LOST says applied),
or failed. Afterwards ``verify`` reads what the server kept and checks:

- nothing lost: every acknowledged (or ``applied``) message is in its session's history;
- nothing twice: no message is in a history twice;
- no hidden effect: a stored message whose call failed was reported with an effect that may
  have happened (``unknown``, or a connection lost after retries), never as a plain failure;
  a call refused with effect ``none`` is not stored;
- events gap-free, resume exact: the event log read from sequence 0 is 1..n with no gap, and a
  subscriber resuming after any sequence k gets exactly the events after k.

A case adds a fault between ``Load.start`` and ``Load.finish``; waits are on the ledger's
counts (``Ledger.reached``), never on time.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.contract.errors import ACPError, TransportError
from cleveragents.acp.v1 import events_pb2, session_pb2

# ``make chaos`` sets a larger scale: more writers, more writes, longer outages.
SCALE = max(1, int(os.environ.get("ACP_CHAOS_SCALE", "1")))


@dataclass
class Outcome:
    """How one call ended, as its client saw it."""

    text: str
    session_id: str
    # acked | applied | none | unknown | failed
    kind: str
    error: ACPError | None = None


def classify(err: ACPError) -> str:
    effect = err.details.get("effect")
    if effect in ("applied", "none", "unknown"):
        return str(effect)
    if err.details.get("refinement") == "REQUEST_ANSWER_LOST":
        # Killed after the effect committed, before its answer was stored: it took effect once
        # (docs/idempotency.md).
        return "applied"
    if isinstance(err, TransportError):
        # The connection was lost after every retry: whether it happened is not known.
        return "unknown"
    return "failed"


@dataclass
class Ledger:
    outcomes: list[Outcome] = field(default_factory=list)
    _waiters: list[tuple[Callable[[Ledger], bool], asyncio.Event]] = field(default_factory=list)

    def note(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)
        for check, event in self._waiters:
            if check(self):
                event.set()

    def count(self, *kinds: str) -> int:
        return sum(1 for outcome in self.outcomes if outcome.kind in kinds)

    async def reached(self, check: Callable[[Ledger], bool], seconds: float = 120.0) -> None:
        """Until ``check(ledger)`` holds (bounded: a case that never gets there fails)."""
        event = asyncio.Event()
        if check(self):
            return
        self._waiters.append((check, event))
        try:
            await asyncio.wait_for(event.wait(), seconds)
        except TimeoutError:
            raise AssertionError(f"the load never got there: {self.summary()}") from None
        finally:
            self._waiters.remove((check, event))

    def errors(self, *kinds: str) -> list[ACPError]:
        return [o.error for o in self.outcomes if o.kind in kinds and o.error is not None]

    def summary(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for outcome in self.outcomes:
            found[outcome.kind] = found.get(outcome.kind, 0) + 1
        return found


def client_for(http_url: str | None, grpc_target: str | None, token: str) -> ACPClient:
    if grpc_target is not None:
        return ACPClient(GrpcTransport.connect(grpc_target, timeout=60), token=token)
    assert http_url is not None
    return ACPClient(HTTPTransport.connect(http_url, timeout=60), token=token)


class Load:
    """``writers`` clients, each telling ``per_writer`` messages to a session of its own."""

    def __init__(
        self,
        ledger: Ledger,
        token: str,
        *,
        http_url: str | None = None,
        grpc_target: str | None = None,
        writers: int = 4,
        per_writer: int = 15,
    ) -> None:
        self.ledger = ledger
        self.token = token
        self.http_url, self.grpc_target = http_url, grpc_target
        self.writers, self.per_writer = writers, per_writer
        self.sessions: list[str] = []
        # Calls sent and not yet answered (a case waits for every writer to have one).
        self.in_flight = 0
        self._all_writing = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        for index in range(self.writers):
            async with self._client() as client:
                created = await client.call("session.create", title=f"writer {index}")
            assert isinstance(created, session_pb2.CreateSessionResponse)
            self.sessions.append(created.session.meta.id)
        self._tasks = [asyncio.create_task(self._write(i, sid)) for i, sid in enumerate(self.sessions)]

    def _client(self) -> ACPClient:
        return client_for(self.http_url, self.grpc_target, self.token)

    async def _write(self, index: int, session_id: str) -> None:
        async with self._client() as client:
            for n in range(self.per_writer):
                text = f"w{index}-{n}"
                self.in_flight += 1
                if self.in_flight >= self.writers:
                    self._all_writing.set()
                try:
                    await client.call("session.tell", session_id=session_id, content=text)
                except ACPError as err:
                    self.ledger.note(Outcome(text, session_id, classify(err), err))
                else:
                    self.ledger.note(Outcome(text, session_id, "acked"))
                finally:
                    self.in_flight -= 1

    async def all_writing(self) -> None:
        """Until every writer has a call sent and not answered (bounded)."""
        self._all_writing.clear()
        if self.in_flight < self.writers:
            await asyncio.wait_for(self._all_writing.wait(), 120)

    async def finish(self) -> None:
        await asyncio.gather(*self._tasks)


async def verify(ledger: Ledger, client: ACPClient, sessions: list[str]) -> list[events_pb2.Event]:
    """The ledger against what the server keeps (module docstring); the event log read."""
    stored: dict[str, list[str]] = {}
    for session_id in sessions:
        shown = await client.call("session.show", session_id=session_id)
        assert isinstance(shown, session_pb2.GetSessionResponse)
        stored[session_id] = [m.content for m in shown.messages if m.role == session_pb2.MESSAGE_ROLE_USER]
    problems: list[str] = []
    for session_id, texts in stored.items():
        twice = sorted({t for t in texts if texts.count(t) > 1})
        if twice:
            problems.append(f"stored twice in {session_id}: {twice}")
    for outcome in ledger.outcomes:
        kept = outcome.text in stored[outcome.session_id]
        if outcome.kind in ("acked", "applied") and not kept:
            problems.append(f"lost: {outcome.text} ({outcome.kind})")
        if outcome.kind == "none" and kept:
            problems.append(f"said to have no effect but stored: {outcome.text}: {outcome.error!r}")
        if outcome.kind == "failed" and kept:
            problems.append(f"stored though its client was told it failed: {outcome.text}: {outcome.error!r}")
    assert not problems, "\n".join(problems[:20])
    return await check_events(client)


async def check_events(client: ACPClient) -> list[events_pb2.Event]:
    """Gap-free from 1, and a resume after any k (a few spread over the log) exact; the log."""
    marker = await client.call("session.create", title="end of the load")
    assert isinstance(marker, session_pb2.CreateSessionResponse)
    end = f"end {marker.session.meta.id}"
    await client.call("session.tell", session_id=marker.session.meta.id, content=end)
    everything = await _events_until(client, 0, end)
    sequences = [event.sequence for event in everything]
    assert sequences == list(range(1, len(sequences) + 1)), "the event log has a gap or a repeat"
    for after in sorted({len(sequences) // 4, len(sequences) // 2, len(sequences) - 2}):
        resumed = await _events_until(client, after, end)
        assert [e.sequence for e in resumed] == sequences[after:], f"resume after {after} is not exact"
    return everything


async def _events_until(client: ACPClient, after: int, end: str) -> list[events_pb2.Event]:
    got: list[events_pb2.Event] = []

    async def read() -> None:
        async for event in client.subscribe(after_sequence=after):
            got.append(event)
            if event.HasField("session_message") and event.session_message.message.content == end:
                return

    await asyncio.wait_for(read(), 120)
    return got
