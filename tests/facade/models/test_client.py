"""ChatModels against the fake OpenAI-compatible server: what it sends, how a stream is
assembled, retries (Retry-After, backoff, bounds), timeouts, broken streams, keys, cancel."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from cleveragents.acp.facade.domain.models import client
from cleveragents.acp.facade.domain.models.client import NO_KEY, ChatModels
from cleveragents.acp.facade.domain.models.failures import ModelCancelledError, ModelError
from cleveragents.acp.facade.domain.models.settings import ModelSettings
from cleveragents.acp.v1 import specs_pb2
from tests.fake_openai import (
    FakeOpenAI,
    Hang,
    Stream,
    chunk,
    error,
    eventually,
    tool_call_chunks,
    turn,
    usage,
)

KEY = "sk-test-0123456789abcdef-secret"
MESSAGES = [{"role": "user", "content": "hello"}]


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    async with FakeOpenAI() as server:
        yield server


class Pieces:
    def __init__(self) -> None:
        self.items: list[tuple[int, str]] = []

    async def __call__(self, index: int, text: str) -> None:
        self.items.append((index, text))

    @property
    def text(self) -> str:
        return "".join(t for _, t in self.items)


def actor(fake: FakeOpenAI, **given: Any) -> specs_pb2.ActorSpec:
    spec = specs_pb2.ActorSpec(
        provider="openai", model="fake-model", base_url=fake.base_url, api_key_env="TEST_KEY"
    )
    for name, value in given.items():
        setattr(spec, name, value)
    return spec


@pytest.fixture
async def models() -> AsyncIterator[ChatModels]:
    settings = ModelSettings(
        retries=2, backoff_seconds=0.01, max_backoff_seconds=0.02, read_timeout_seconds=5
    )
    chat = ChatModels(settings, {"TEST_KEY": KEY})
    yield chat
    await chat.close()


def recorded_sleeps(models: ChatModels) -> list[float]:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    models.sleep = sleep
    return slept


async def test_text_streams_in_pieces_and_the_request_is_the_wire_format(
    fake: FakeOpenAI, models: ChatModels
) -> None:
    fake.then(turn("Hello there, world", pieces=4, tokens=(12, 5)))
    pieces = Pieces()
    tools = [{"type": "function", "function": {"name": "fs_read", "parameters": {"type": "object"}}}]
    result = await models.stream("a", actor(fake), MESSAGES, tools, pieces)
    assert result.text == "Hello there, world"
    assert pieces.text == result.text
    assert [i for i, _ in pieces.items] == list(range(len(pieces.items)))
    assert result.finish_reason == "stop"
    assert result.usage is not None
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (12, 5)
    (request,) = fake.requests
    assert request.method == "POST"
    assert request.path == "/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body == {
        "model": "fake-model",
        "stream": True,
        "messages": MESSAGES,
        "stream_options": {"include_usage": True},
        "tools": tools,
    }


async def test_turns_in_a_row_reuse_one_connection(fake: FakeOpenAI, models: ChatModels) -> None:
    """The body is read to its end after [DONE], so the connection goes back to the pool:
    a new connection per turn would be a new TLS handshake per turn against a hosted model."""
    fake.repeat = turn("Hello there, world", pieces=4, tokens=(12, 5))
    for _ in range(3):
        assert (await models.stream("a", actor(fake), MESSAGES, [], Pieces())).text == "Hello there, world"
    assert len(fake.requests) == 3
    assert fake.connections == 1


async def test_lines_after_done_are_read_only_up_to_a_bound(fake: FakeOpenAI, models: ChatModels) -> None:
    """A server that keeps writing after [DONE]: the answer is what came before it, the
    rest is read only up to DRAIN_LINES, then that connection is closed, not reused."""
    chunks: list[dict[str, Any] | str] = [
        chunk({"role": "assistant", "content": "done here"}),
        chunk({}, "stop"),
    ]
    chunks += ["[DONE]"] + ['{"junk": 1}'] * (client.DRAIN_LINES * 2)
    fake.then(Stream(chunks), turn("next", pieces=1))
    first = await models.stream("a", actor(fake), MESSAGES, [], Pieces())
    assert first.text == "done here"
    assert (await models.stream("a", actor(fake), MESSAGES, [], Pieces())).text == "next"
    assert fake.connections == 2


async def test_a_server_silent_after_done_does_not_hold_the_turn(fake: FakeOpenAI) -> None:
    """[DONE] and then nothing, the body never ended: the turn ends within the drain's
    bound, not the read timeout, and the next turn opens a new connection."""
    settings = ModelSettings(retries=0, read_timeout_seconds=60)
    chat = ChatModels(settings, {"TEST_KEY": KEY})
    try:
        fake.then(Stream(turn("quiet", pieces=2).chunks, end="linger"), turn("again", pieces=1))
        started = time.monotonic()
        assert (await chat.stream("a", actor(fake), MESSAGES, [], Pieces())).text == "quiet"
        assert time.monotonic() - started < client.DRAIN_SECONDS + 5
        assert (await chat.stream("a", actor(fake), MESSAGES, [], Pieces())).text == "again"
        assert fake.connections == 2
    finally:
        await chat.close()


async def test_tool_call_arguments_split_over_chunks_are_joined(fake: FakeOpenAI, models: ChatModels) -> None:
    args = '{"path": "notes/a.txt", "content": "line one\\nline two"}'
    chunks: list[dict[str, Any] | str] = [chunk({"role": "assistant", "content": None})]
    chunks += tool_call_chunks(0, "call_a", "fs_write", args, pieces=7)
    chunks += tool_call_chunks(1, "call_b", "fs_read", '{"path": "x"}', pieces=2)
    chunks += [chunk({}, "tool_calls"), usage(30, 9)]
    fake.then(Stream(chunks))
    result = await models.stream("a", actor(fake), MESSAGES, [], Pieces())
    assert [(c.id, c.name, c.arguments) for c in result.tool_calls] == [
        ("call_a", "fs_write", args),
        ("call_b", "fs_read", '{"path": "x"}'),
    ]
    assert result.text == ""
    assert "tools" not in fake.requests[0].body


async def test_no_usage_from_the_server_is_none(fake: FakeOpenAI, models: ChatModels) -> None:
    fake.then(turn("ok", tokens=None))
    assert (await models.stream("a", actor(fake), MESSAGES, [], Pieces())).usage is None


async def test_a_429_is_retried_after_the_retry_after_it_names(fake: FakeOpenAI, models: ChatModels) -> None:
    slept = recorded_sleeps(models)
    fake.then(error(429, "slow down", kind="rate_limit_error", retry_after="2"), turn("done"))
    result = await models.stream("a", actor(fake), MESSAGES, [], Pieces())
    assert result.text == "done"
    assert slept == [2.0]
    assert len(fake.requests) == 2


async def test_5xx_is_retried_with_backoff_then_gives_up(fake: FakeOpenAI, models: ChatModels) -> None:
    slept = recorded_sleeps(models)
    fake.then(*[error(503, "overloaded")] * 3)
    with pytest.raises(ModelError) as info:
        await models.stream("a", actor(fake), MESSAGES, [], Pieces())
    assert info.value.reason == "model_unavailable"
    assert "HTTP 503: overloaded" in info.value.message
    assert "gave up after 3 attempts" in info.value.message
    assert slept == [0.01, 0.02]
    assert len(fake.requests) == 3


async def test_a_retry_after_beyond_the_bound_fails_at_once(fake: FakeOpenAI, models: ChatModels) -> None:
    slept = recorded_sleeps(models)
    fake.then(error(429, "quota", retry_after="3600"))
    with pytest.raises(ModelError) as info:
        await models.stream("a", actor(fake), MESSAGES, [], Pieces())
    assert info.value.reason == "model_rate_limited"
    assert info.value.to_acp().code == "BUDGET_EXCEEDED"
    assert "3600" in info.value.message
    assert slept == []


async def test_the_real_wait_honours_retry_after(fake: FakeOpenAI) -> None:
    chat = ChatModels(ModelSettings(retries=1), {"TEST_KEY": KEY})
    fake.then(error(503, "busy", retry_after="1"), turn("later"))
    started = time.monotonic()
    try:
        assert (await chat.stream("a", actor(fake), MESSAGES, [], Pieces())).text == "later"
    finally:
        await chat.close()
    assert time.monotonic() - started >= 0.95


async def test_a_missing_key_names_the_variable(fake: FakeOpenAI) -> None:
    chat = ChatModels(ModelSettings(), {})
    with pytest.raises(ModelError) as info:
        await chat.stream("writer", actor(fake), MESSAGES, [], Pieces())
    await chat.close()
    error_ = info.value.to_acp()
    assert error_.code == "INVALID_STATE"
    assert error_.details["refinement"] == "MODEL_KEY_MISSING"
    assert "TEST_KEY" in error_.message
    assert "writer" in error_.message
    assert fake.requests == []


async def test_a_refused_key_is_not_repeated(fake: FakeOpenAI, models: ChatModels) -> None:
    fake.then(error(401, f"Incorrect API key provided: {KEY}", kind="invalid_request_error"))
    with pytest.raises(ModelError) as info:
        await models.stream("a", actor(fake), MESSAGES, [], Pieces())
    failure = info.value.to_acp()
    assert failure.details["refinement"] == "MODEL_KEY_REFUSED"
    assert "TEST_KEY" in failure.message
    assert KEY not in failure.message
    assert KEY not in repr(failure.details)
    assert len(fake.requests) == 1


async def test_other_refusals_quote_the_server_with_the_key_masked(
    fake: FakeOpenAI, models: ChatModels
) -> None:
    fake.then(error(404, f"model 'nope' not found (key {KEY})", kind="invalid_request_error"))
    with pytest.raises(ModelError) as info:
        await models.stream("a", actor(fake), MESSAGES, [], Pieces())
    assert info.value.reason == "model_request_refused"
    assert "model 'nope' not found" in info.value.message
    assert KEY not in info.value.message


async def test_the_key_is_read_at_each_call(fake: FakeOpenAI) -> None:
    environ = {"TEST_KEY": "first-key"}
    chat = ChatModels(ModelSettings(), environ)
    fake.then(turn("1"), turn("2"))
    await chat.stream("a", actor(fake), MESSAGES, [], Pieces())
    environ["TEST_KEY"] = "second-key"
    await chat.stream("a", actor(fake), MESSAGES, [], Pieces())
    await chat.close()
    assert [r.headers["authorization"] for r in fake.requests] == ["Bearer first-key", "Bearer second-key"]


async def test_an_actor_without_a_key_variable_never_sends_the_servers_openai_key(
    fake: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    chat = ChatModels(ModelSettings())
    fake.then(turn("local"))
    await chat.stream("a", actor(fake, api_key_env=""), MESSAGES, [], Pieces())
    await chat.close()
    assert fake.requests[0].headers["authorization"] == f"Bearer {NO_KEY}"


@pytest.mark.parametrize(
    ("stream", "words"),
    [
        (Stream([chunk({"content": "half an ans"})], end="eof"), "no finish_reason"),
        (Stream([chunk({"content": "x"}), "{not json"]), "malformed"),
        (Stream([chunk({"content": "x"}), {"error": {"message": "upstream exploded"}}]), "upstream exploded"),
        (Stream([chunk({"content": "some text"})], end="reset"), "broke off"),
        (Stream([{"id": "x", "object": "chat.completion.chunk"}]), "neither choices nor usage"),
    ],
    ids=["cut", "malformed", "error-event", "reset-after-text", "shapeless"],
)
async def test_broken_streams_fail_clearly(
    fake: FakeOpenAI, models: ChatModels, stream: Stream, words: str
) -> None:
    fake.then(stream)
    with pytest.raises(ModelError) as info:
        await models.stream("a", actor(fake), MESSAGES, [], Pieces())
    assert info.value.reason == "model_stream_broken"
    assert words in info.value.message
    assert len(fake.requests) == 1


async def test_a_reset_before_any_text_is_retried(fake: FakeOpenAI, models: ChatModels) -> None:
    recorded_sleeps(models)
    fake.then(Stream([chunk({"role": "assistant"})], end="reset"), turn("second try"))
    assert (await models.stream("a", actor(fake), MESSAGES, [], Pieces())).text == "second try"


async def test_a_server_that_does_not_answer_times_out_and_is_retried(fake: FakeOpenAI) -> None:
    chat = ChatModels(
        ModelSettings(retries=1, backoff_seconds=0, read_timeout_seconds=0.3), {"TEST_KEY": KEY}
    )
    fake.then(Hang(5), Hang(5))
    started = time.monotonic()
    with pytest.raises(ModelError) as info:
        await chat.stream("a", actor(fake), MESSAGES, [], Pieces())
    await chat.close()
    assert info.value.reason == "model_unavailable"
    assert "did not answer in time" in info.value.message
    assert len(fake.requests) == 2
    assert time.monotonic() - started < 4


async def test_a_silence_in_the_middle_of_an_answer_is_a_read_timeout(fake: FakeOpenAI) -> None:
    chat = ChatModels(ModelSettings(retries=2, read_timeout_seconds=0.3), {"TEST_KEY": KEY})
    fake.then(Stream([chunk({"content": "start"}), chunk({"content": "late"}, "stop")], delay=3))
    with pytest.raises(ModelError) as info:
        await chat.stream("a", actor(fake), MESSAGES, [], Pieces())
    await chat.close()
    assert info.value.reason == "model_unavailable"
    assert "went silent" in info.value.message
    # Text had reached the caller: not retried.
    assert len(fake.requests) == 1


async def test_a_connection_refused_is_unavailable(models: ChatModels) -> None:
    recorded_sleeps(models)
    spec = specs_pb2.ActorSpec(provider="openai", model="m", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ModelError) as info:
        await models.stream("a", spec, MESSAGES, [], Pieces())
    assert info.value.reason == "model_unavailable"
    assert "could not be reached" in info.value.message


async def test_cancel_stops_a_streaming_answer_within_a_second(fake: FakeOpenAI, models: ChatModels) -> None:
    fake.then(Stream([chunk({"content": f"word{i} "}) for i in range(50)] + [chunk({}, "stop")], delay=0.2))
    pieces = Pieces()
    cancel = asyncio.Event()
    call = asyncio.ensure_future(models.stream("a", actor(fake), MESSAGES, [], pieces, cancel=cancel))
    await eventually(lambda: pieces.items)
    started = time.monotonic()
    cancel.set()
    with pytest.raises(ModelCancelledError):
        await call
    assert time.monotonic() - started < 1
    await eventually(lambda: fake.dropped)
    assert len(pieces.items) < 50


async def test_max_chars_stops_reading_early(fake: FakeOpenAI, models: ChatModels) -> None:
    fake.then(Stream([chunk({"content": "x" * 100}) for _ in range(20)] + [chunk({}, "stop")]))
    result = await models.stream("a", actor(fake), MESSAGES, [], Pieces(), max_chars=250)
    assert result.finish_reason == "length_budget"
    assert 250 < len(result.text) < 2000


def test_settings_from_the_environment() -> None:
    settings = ModelSettings.from_env({"ACP_MODEL_RETRIES": "5", "ACP_MODEL_READ_TIMEOUT_SECONDS": "2.5"})
    assert (settings.retries, settings.read_timeout_seconds) == (5, 2.5)
    with pytest.raises(ValueError, match="ACP_MODEL_RETRIES"):
        ModelSettings.from_env({"ACP_MODEL_RETRIES": "99"})
    with pytest.raises(ValueError, match="ACP_MODEL_BACKOFF_SECONDS"):
        ModelSettings.from_env({"ACP_MODEL_BACKOFF_SECONDS": "soon"})
