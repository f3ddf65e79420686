"""``RetryPolicy``, ``again`` and ``with_retry``: which failures are retried, and that
retrying is bounded by attempts and by the deadline (a fake clock that the fake sleep
advances, so nothing waits)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from cleveragents.acp.contract import catalog
from cleveragents.acp.contract.errors import ACPError, TransportError
from cleveragents.acp.contract.retry import Retrying, RetryPolicy, again, with_retry

READ = catalog.OPERATIONS["session.list"]
WRITE = catalog.OPERATIONS["session.create"]


def lost(*, sent: bool, **more: object) -> TransportError:
    return TransportError("connection lost", {"sent": sent, **more})


class FakeTime:
    """``sleep`` advances ``now``; every pause is recorded."""

    def __init__(self) -> None:
        self.now = 100.0
        self.pauses: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def test_what_may_be_retried() -> None:
    policy = RetryPolicy()
    assert policy.may_retry(WRITE, lost(sent=False))  # never left: nothing happened
    assert policy.may_retry(WRITE, lost(sent=True))  # may have happened: the server replays
    no_replay = dataclasses.replace(policy, after_send=False)
    assert not no_replay.may_retry(WRITE, lost(sent=True))
    assert no_replay.may_retry(READ, lost(sent=True))  # read-only: harmless either way
    assert not policy.may_retry(READ, lost(sent=False, retryable=False))  # a refused certificate
    # The server's own answers: retried only when it says nothing happened / still running.
    busy = ACPError("BUDGET_EXCEEDED", "busy", {"retryable": True}, refinement="STORE_BUSY")
    assert policy.may_retry(WRITE, busy)
    assert not policy.may_retry(READ, ACPError("INVALID_PARAMS", "no"))


def test_delays_grow_with_jitter_up_to_the_ceiling() -> None:
    policy = RetryPolicy(backoff=0.25, max_backoff=1.0)
    assert [policy.delay(n, lambda: 0.0) for n in range(5)] == [0.125, 0.25, 0.5, 0.5, 0.5]
    assert [policy.delay(n, lambda: 1.0) for n in range(5)] == [0.25, 0.5, 1.0, 1.0, 1.0]
    assert policy.delay(10_000, lambda: 1.0) == 1.0


@pytest.mark.parametrize("bad", [{"attempts": 0}, {"deadline": -1.0}, {"backoff": -0.1}])
def test_nonsense_policies_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"attempts|negative"):
        RetryPolicy(**bad)  # type: ignore[arg-type]


async def test_a_call_that_keeps_failing_stops_after_the_attempts() -> None:
    time = FakeTime()
    told: list[Retrying] = []
    policy = RetryPolicy(attempts=4, deadline=1000, notify=told.append)
    calls = 0

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        raise lost(sent=False)

    with pytest.raises(TransportError) as raised:
        await again(policy, WRITE, lost(sent=False), attempt, sleep=time.sleep, clock=time.clock)
    assert calls == 3  # the first attempt was the caller's
    assert raised.value.details["attempts"] == 4
    assert [(t.attempt, t.attempts) for t in told] == [(2, 4), (3, 4), (4, 4)]
    assert {t.operation for t in told} == {"session.create"}
    assert [t.delay for t in told] == time.pauses


async def test_the_deadline_ends_retrying_before_the_attempts_do() -> None:
    time = FakeTime()
    policy = RetryPolicy(attempts=1000, deadline=5.0, backoff=1.0, max_backoff=1.0)

    async def attempt() -> str:
        raise lost(sent=False)

    with pytest.raises(TransportError) as raised:
        await again(policy, READ, lost(sent=True), attempt, sleep=time.sleep, clock=time.clock)
    # The last pause is cut short: the last attempt starts at the deadline.
    assert sum(time.pauses) == pytest.approx(5.0)
    assert 6 <= raised.value.details["attempts"] <= 12


async def test_the_default_policy_retries_for_its_whole_deadline() -> None:
    """docs/server.md: no attempt starts later than ``deadline`` (20 s) after the first
    failure, and retrying goes on until then: the last attempt starts at the deadline,
    whatever the jitter (issue 30 item 7: the count, 6, ended it after 4 to 8 s)."""
    time = FakeTime()
    policy = RetryPolicy()
    assert policy.deadline == 20.0

    async def attempt() -> str:
        raise lost(sent=False)

    with pytest.raises(TransportError) as raised:
        await again(policy, WRITE, lost(sent=False), attempt, sleep=time.sleep, clock=time.clock)
    assert time.now - 100.0 == pytest.approx(20.0)
    assert raised.value.details["attempts"] < policy.attempts
    assert max(time.pauses) <= policy.max_backoff


async def test_a_retry_that_gets_through_returns_its_answer() -> None:
    time = FakeTime()
    answers: Iterator[TransportError | str] = iter([lost(sent=False), "made"])

    async def attempt() -> str:
        answer = next(answers)
        if isinstance(answer, TransportError):
            raise answer
        return answer

    got = await again(RetryPolicy(), WRITE, lost(sent=False), attempt, sleep=time.sleep, clock=time.clock)
    assert got == "made"
    assert len(time.pauses) == 2


async def test_a_mutating_call_lost_after_sending_is_retried_unless_told_not_to() -> None:
    time = FakeTime()
    calls = 0

    async def attempt() -> str:
        nonlocal calls
        calls += 1
        return "again"

    no_replay = RetryPolicy(after_send=False)
    with pytest.raises(TransportError) as raised:
        await again(no_replay, WRITE, lost(sent=True), attempt, sleep=time.sleep, clock=time.clock)
    assert (calls, raised.value.details["attempts"]) == (0, 1)
    answer = await again(RetryPolicy(), WRITE, lost(sent=True), attempt, sleep=time.sleep, clock=time.clock)
    assert answer == "again"


async def test_an_answer_that_is_no_reason_to_retry_ends_the_retrying() -> None:
    time = FakeTime()
    answers = iter([ACPError("BUDGET_EXCEEDED", "busy", {"retryable": True}), ACPError("NOT_FOUND", "gone")])

    async def attempt() -> str:
        raise next(answers)

    with pytest.raises(ACPError) as raised:
        await again(RetryPolicy(), WRITE, lost(sent=True), attempt, sleep=time.sleep, clock=time.clock)
    assert raised.value.code == "NOT_FOUND"
    assert len(time.pauses) == 2
    assert RetryPolicy.OFF.attempts == 1
    assert not RetryPolicy.OFF.enabled


async def test_with_retry_tries_again_only_after_an_error_the_policy_retries() -> None:
    """The transports' wrapper: one attempt when it succeeds or the error is final or
    retrying is off; otherwise ``again`` (a backoff of 0: nothing waits)."""
    calls = 0

    async def lost_once() -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise lost(sent=False)
        return "answer"

    async def refused() -> str:
        nonlocal calls
        calls += 1
        raise ACPError("INVALID_PARAMS", "no")

    assert await with_retry(RetryPolicy(backoff=0), WRITE, lost_once) == "answer"
    assert calls == 2
    calls = 0
    with pytest.raises(TransportError) as info:
        await with_retry(RetryPolicy.OFF, WRITE, lost_once)
    assert calls == 1
    assert "attempts" not in info.value.details
    calls = 0
    with pytest.raises(ACPError, match="no"):
        await with_retry(RetryPolicy(backoff=0), READ, refused)
    assert calls == 1
