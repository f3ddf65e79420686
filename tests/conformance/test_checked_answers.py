"""The contract suite fails on a transport that answers wrongly but consistently: times all
shifted by an hour, or an INTERNAL_ERROR to every client of the prior minor. The canonical
traces alone would not see either (the first keeps which instants are equal; the second
was once counted as "not VERSION_MISMATCH")."""

from __future__ import annotations

import datetime
import pathlib
import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
from google.protobuf import message

from cleveragents.acp.contract import codec, versions
from cleveragents.acp.contract.catalog import Operation
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.contract.transport import CallOptions, Transport
from tests.conformance.backends import open_backend
from tests.conformance.canonical import TIME
from tests.conformance.generated import PRIOR, SCENARIOS
from tests.conformance.harness import Run
from tests.conformance.times import Window, instant
from tests.server_process import Tokens

HOUR = datetime.timedelta(hours=1)


def later(match: re.Match[str]) -> str:
    return (instant(match.group(0)) + HOUR).isoformat().replace("+00:00", "Z")


def shifted(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: shifted(item) for key, item in value.items()}
    if isinstance(value, list):
        return [shifted(item) for item in value]
    if isinstance(value, str):
        return TIME.sub(later, value)
    return value


def shift(response: message.Message) -> message.Message:
    return codec.response_from_dict(shifted(codec.to_dict(response)), type(response))


class ShiftingTransport:
    """Every time of every answer and stream item an hour late: consistent, so which
    instants are equal stays the same."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner

    async def call(self, op: Operation, request: message.Message, options: CallOptions) -> message.Message:
        return shift(await self.inner.call(op, request, options))

    async def open_stream(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> AsyncIterator[message.Message]:
        items = await self.inner.open_stream(op, request, options)

        async def later_items() -> AsyncIterator[message.Message]:
            try:
                async for item in items:
                    yield shift(item)
            finally:
                await items.aclose()  # type: ignore[attr-defined]

        return later_items()

    async def close(self) -> None:
        await self.inner.close()


class BrokenPriorTransport:
    """INTERNAL_ERROR to every call the prior minor serves (it still refuses, rightly, what
    is newer than it); the current minor is served."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner

    def _refuse(self, op: Operation, options: CallOptions) -> None:
        if options.acp_version == PRIOR and not versions.newer(op.since, PRIOR):
            raise ACPError(ErrorCode.INTERNAL_ERROR, "injected at the prior minor")

    async def call(self, op: Operation, request: message.Message, options: CallOptions) -> message.Message:
        self._refuse(op, options)
        return await self.inner.call(op, request, options)

    async def open_stream(
        self, op: Operation, request: message.Message, options: CallOptions
    ) -> AsyncIterator[message.Message]:
        self._refuse(op, options)
        return await self.inner.open_stream(op, request, options)

    async def close(self) -> None:
        await self.inner.close()


@pytest.mark.parametrize("name", ["sessions", "plan.lifecycle"])
async def test_times_shifted_by_an_hour_fail_the_scenario(
    name: str, tmp_path: pathlib.Path, tokens: Tokens
) -> None:
    async with open_backend("http", tmp_path, tokens) as backend:
        backend.transport = ShiftingTransport(backend.transport)
        with pytest.raises(AssertionError, match="outside the call's window"):
            await SCENARIOS[name](Run(backend))


async def test_an_internal_error_at_the_prior_minor_fails_the_version_matrix(
    tmp_path: pathlib.Path, tokens: Tokens
) -> None:
    async with open_backend("local", tmp_path, tokens) as backend:
        backend.transport = BrokenPriorTransport(backend.transport)
        with pytest.raises(ACPError) as info:
            await SCENARIOS["version.matrix"](Run(backend))
        assert info.value.code == "INTERNAL_ERROR", info.value


def test_a_time_before_the_backend_or_after_the_answer_is_refused() -> None:
    opened = datetime.datetime(2026, 1, 1, 12, tzinfo=datetime.UTC)
    checked = Window(opened, opened + HOUR, opened + 2 * HOUR)
    checked.check({"meta": {"create_time": "2026-01-01T12:30:00Z", "update_time": "2026-01-01T14:00:00Z"}})
    checked.check({"expire_time": "2026-01-01T14:00:30Z"})
    for bad in (
        {"create_time": "2026-01-01T11:59:00Z"},
        {"create_time": "2026-01-01T14:01:00Z"},
        {"text": "written 2026-01-01T15:00:00Z"},
        {"expire_time": "2026-01-01T14:02:00Z"},
        {"expire_time": "2026-01-01T12:59:00Z"},
    ):
        with pytest.raises(AssertionError, match="outside the call's window"):
            checked.check(bad)
    with pytest.raises(AssertionError, match="after update_time"):
        checked.check({"create_time": "2026-01-01T13:00:00Z", "update_time": "2026-01-01T12:30:00Z"})
    with pytest.raises(AssertionError, match="after end_time"):
        checked.check({"start_time": "2026-01-01T13:00:00Z", "end_time": "2026-01-01T12:30:00Z"})
