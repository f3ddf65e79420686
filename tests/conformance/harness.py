"""Scenarios written once against ``ACPClient`` and run on every transport.

A ``RecordingTransport`` wraps the backend's transport and writes every call (operation,
request, version, who called, and the response or error) and every stream item into the
run's trace, and checks every time an answer carries against the wall clock around the call
(``times.py``); ``run_everywhere`` runs one scenario on every transport, each over a fresh
backend, canonicalizes the traces and asserts they are identical.

``COVERAGE`` keeps which operations and which errors the whole suite exercised, counting
only outcomes a test asserted: an error once ``Run.fails`` checked its code, a success once
its answer was checked (``Run.answered``). A call whose answer nobody checked covers nothing.
"""

from __future__ import annotations

import asyncio
import datetime
import pathlib
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from google.protobuf import message

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.contract import catalog, codec
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError, grpc_code
from cleveragents.acp.contract.transport import CallOptions, Transport
from cleveragents.acp.v1 import events_pb2
from tests.conformance.backends import KINDS, Backend, open_backend
from tests.conformance.canonical import Canonicalizer
from tests.conformance.times import Window, now
from tests.server_process import Tokens

Entry = dict[str, Any]


@dataclass
class Coverage:
    """Outcomes a test asserted, per transport, over the whole test session: successes whose
    answer was checked, errors whose code was."""

    # (kind, operation) of the checked successes.
    succeeded: set[tuple[str, str]] = field(default_factory=set)
    errors: set[tuple[str, str, str, str]] = field(default_factory=set)
    # Tests whose recordings the coverage checks rely on, once they passed.
    passed: set[str] = field(default_factory=set)

    def record(self, kind: str, op: Operation, error: ACPError | None) -> None:
        if error is None:
            self.succeeded.add((kind, op.name))
        else:
            refinement = str(error.details.get("refinement", ""))
            self.errors.add((kind, op.name, error.code, refinement))

    def successes(self, kind: str) -> set[str]:
        return {name for (k, name) in self.succeeded if k == kind}

    def codes(self, kind: str) -> set[tuple[str, str, str]]:
        return {(name, code, refinement) for (k, name, code, refinement) in self.errors if k == kind}


COVERAGE = Coverage()
# Which transport and operation each error raised through a recording transport came from,
# so ``Run.fails`` can count it once it checked it.
ORIGINS: weakref.WeakKeyDictionary[ACPError, tuple[str, Operation]] = weakref.WeakKeyDictionary()


def error_json(err: ACPError) -> Entry:
    """The error as the trace keeps it, with its gRPC status: the one it crossed gRPC with,
    or the one the error table gives its code (so a gRPC server answering another status
    than the table's makes the gRPC trace differ)."""
    grpc_status = err.grpc_status or grpc_code(err.code).name
    return {"code": err.code, "message": err.message, "details": err.details, "grpc_status": grpc_status}


class RecordingTransport:
    """A transport that writes what passes through it into a trace."""

    def __init__(
        self, inner: Transport, kind: str, trace: list[Entry], who: str, opened: datetime.datetime
    ) -> None:
        self.inner = inner
        self.kind = kind
        self.trace = trace
        self.who = who
        self.opened = opened

    def _entry(self, op: Operation, request: message.Message, options: CallOptions) -> Entry:
        entry: Entry = {"op": op.name, "who": self.who, "request": codec.to_dict(request)}
        if options.acp_version is not None:
            entry["acp_version"] = options.acp_version
        self.trace.append(entry)
        return entry

    async def call(self, op: Operation, request: message.Message, options: CallOptions) -> message.Message:
        entry = self._entry(op, request, options)
        sent = now()
        try:
            response = await self.inner.call(op, request, options)
        except ACPError as err:
            entry["error"] = error_json(err)
            ORIGINS[err] = (self.kind, op)
            raise
        entry["data"] = codec.to_dict(response)
        Window(self.opened, sent, now()).check(entry["data"])
        return response

    async def open_stream(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> AsyncIterator[message.Message]:
        entry = self._entry(op, request, options)
        try:
            items = await self.inner.open_stream(op, request, options)
        except ACPError as err:
            entry["error"] = error_json(err)
            ORIGINS[err] = (self.kind, op)
            raise
        entry["items"] = []
        return RecordedStream(self.kind, op, items, entry, self.opened)

    async def close(self) -> None:
        """The backend owns the inner transport."""


class RecordedStream:
    """The items of an admitted stream, each written into the call's entry as it arrives.

    ``aclose`` closes the transport's stream even when no item was read."""

    def __init__(
        self,
        kind: str,
        op: Operation,
        items: AsyncIterator[message.Message],
        entry: Entry,
        opened: datetime.datetime,
    ) -> None:
        self.kind = kind
        self.op = op
        self.items = items
        self.entry = entry
        self.opened = opened

    def __aiter__(self) -> RecordedStream:
        return self

    async def __anext__(self) -> message.Message:
        # An event is stamped when it happens, so no later than it arrives; it may be
        # older than the read (a backlog), never older than the backend.
        try:
            item = await anext(self.items)
        except ACPError as err:
            self.entry["error"] = error_json(err)
            ORIGINS[err] = (self.kind, self.op)
            raise
        data = codec.to_dict(item)
        Window(self.opened, self.opened, now()).check(data)
        self.entry["items"].append(data)
        return item

    async def aclose(self) -> None:
        aclose = getattr(self.items, "aclose", None)
        if aclose is not None:
            await aclose()


@dataclass
class Run:
    """One scenario on one backend: recording clients, the trace, scratch space."""

    backend: Backend
    trace: list[Entry] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.backend.kind

    @property
    def root(self) -> pathlib.Path:
        return self.backend.root

    def client(self, principal: str | None = "alice", *, acp_version: str | None = None) -> ACPClient:
        who = principal if principal is None or principal in self.backend.tokens.tokens else "<other>"
        transport = RecordingTransport(
            self.backend.transport, self.kind, self.trace, str(who), self.backend.opened
        )
        return ACPClient(transport, token=self.backend.token(principal), acp_version=acp_version)

    def note(self, label: str, value: Any) -> None:
        """Something the scenario derived (not a call) that must match across transports."""
        if isinstance(value, message.Message):
            value = codec.to_dict(value)
        self.trace.append({"note": label, "value": value})

    def answered(self, op: str | Operation) -> None:
        """Count a success of ``op`` on this run's transport as covered: call it only once
        the answer was checked for what the call must say."""
        operation = op if isinstance(op, Operation) else catalog.OPERATIONS[op]
        COVERAGE.record(self.kind, operation, None)

    @staticmethod
    async def fails(action: Awaitable[Any], code: str, refinement: str | None = None) -> ACPError:
        """The ACPError ``action`` raises, after checking its code (and refinement). Once
        checked, the error counts as covered for the call that answered it."""
        with pytest.raises(ACPError) as info:
            await action
        assert info.value.code == code, info.value
        if refinement is not None:
            assert info.value.details.get("refinement") == refinement, info.value
        origin = ORIGINS.get(info.value)
        if origin is not None:
            COVERAGE.record(origin[0], origin[1], info.value)
        return info.value

    @staticmethod
    async def events(
        client: ACPClient,
        until: Callable[[events_pb2.Event], bool],
        *,
        seconds: float = 10.0,
        **filters: Any,
    ) -> list[events_pb2.Event]:
        """Events of a subscription up to and including the first that satisfies ``until``."""
        found: list[events_pb2.Event] = []
        stream = client.subscribe(filters)
        try:
            async with asyncio.timeout(seconds):
                async for event in stream:
                    found.append(event)
                    if until(event):
                        return found
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        raise AssertionError(f"stream ended after {len(found)} events")


Scenario = Callable[[Run], Awaitable[None]]


def first_difference(expected: list[Entry], actual: list[Entry]) -> str:
    for index, (a, b) in enumerate(zip(expected, actual, strict=False)):
        if a != b:
            return f"entry {index}:\n  local: {a}\n  other: {b}"
    return f"lengths {len(expected)} and {len(actual)}"


async def run_everywhere(scenario: Scenario, tmp_path: pathlib.Path, tokens: Tokens) -> list[Entry]:
    """Run ``scenario`` on each transport over a fresh backend; their canonical traces must be
    identical. Returns the canonical trace, and checks every HTTP answer was an envelope."""
    traces: dict[str, list[Entry]] = {}
    for index, kind in enumerate(KINDS):
        # Folder names of one length: paths reach prompts, whose size is counted in tokens.
        async with open_backend(kind, tmp_path / f"backend{index}", tokens) as backend:
            run = Run(backend)
            await scenario(run)
            assert backend.envelopes.problems == [], backend.envelopes.problems
            traces[kind] = Canonicalizer([str(backend.root)])(run.trace)
    for kind in KINDS[1:]:
        assert traces[kind] == traces["local"], f"{kind} differs from local at " + first_difference(
            traces["local"], traces[kind]
        )
    return traces["local"]
