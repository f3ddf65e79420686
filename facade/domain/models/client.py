"""``ChatModels``: streamed chat completions from any OpenAI-compatible server (OpenAI, vLLM,
Ollama, llama.cpp, LM Studio), through the ``openai`` package's ``AsyncOpenAI``.

- The API key is read from the actor's environment variable at each call and handed to that
  call's client only; it is never kept, logged, or put in an error. An actor without
  ``api_key_env`` sends a placeholder, never the server's ``OPENAI_API_KEY``.
- Before every request the actor's URL and key variable are checked against the operator's
  allow-lists (``egress``): an actor registered before the operator narrowed them is refused
  here, before its key is read. The client is given the normalised URL that was checked, and
  follows no redirect.
- Retries are ours (the library's are off): a 429 or 5xx, a refused connection or a timeout
  before the first piece of text is tried again after ``Retry-After`` (when the server sends
  one, up to a bound) or an exponential backoff, a bounded number of times.
- A cancel stops the call at once: the stream's connection is closed, whatever was
  received is delivered, and ``ModelCancelledError`` is raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import logging
import math
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cleveragents.acp.contract.recent import Recent
from cleveragents.acp.facade.domain.models.deltas import DeltaPump, Emit
from cleveragents.acp.facade.domain.models.egress import ModelEgress
from cleveragents.acp.facade.domain.models.failures import ModelCancelledError, ModelError
from cleveragents.acp.facade.domain.models.secret_mask import SecretMask
from cleveragents.acp.facade.domain.models.settings import ModelSettings
from cleveragents.acp.facade.domain.models.wire import SSEReader, StreamEndError, Turn, TurnBuilder
from cleveragents.acp.facade.domain.tracing import traced
from cleveragents.acp.v1 import specs_pb2

if TYPE_CHECKING:
    import openai

log = logging.getLogger(__name__)

# Sent as the key by actors that name no environment variable (local servers need none).
NO_KEY = "no-key"
# Upstream error text quoted in our messages, at most.
QUOTED_CHARS = 300
# Upstream text looked at for an echoed key: a quote is cut to QUOTED_CHARS after masking,
# and an error message longer than this is cut here.
MASKED_CHARS = 4096
# What a stream may still send after ``data: [DONE]`` is read, at most, for its connection to
# go back to the pool (a well-behaved server sends only the end of the body, at once).
DRAIN_LINES = 64
DRAIN_SECONDS = 0.25
_CLIENTS = 64


class ChatModels:
    """Opens streamed completions for actors; one connection pool for every model server."""

    def __init__(
        self,
        settings: ModelSettings | None = None,
        environ: Mapping[str, str] | None = None,
        egress: ModelEgress | None = None,
    ) -> None:
        self.settings = settings or ModelSettings()
        self._environ = environ if environ is not None else os.environ
        self.egress = egress if egress is not None else ModelEgress()
        self._http: Any = None
        self._clients: Recent[str, openai.AsyncOpenAI] = Recent(_CLIENTS)
        self.sleep: Callable[[float], Any] = asyncio.sleep

    async def close(self) -> None:
        if self._http is not None:
            await self._http.aclose()

    def client(self, base_url: str) -> openai.AsyncOpenAI:
        """The client of one model server, made once per base URL over the one connection
        pool; without a key (each call gives its own, ``with_options``)."""
        # Imported at the first model call: the openai package takes a second of CPU to
        # import, which every local-mode command and server start would pay otherwise.
        import openai

        client = self._clients.get(base_url)
        if client is None:
            if self._http is None:
                # Made on first use, inside the loop that will use it. A redirect is answered
                # as the failure it is, never followed: it could lead past the allow-list.
                self._http = openai.DefaultAsyncHttpxClient(follow_redirects=False)
            client = openai.AsyncOpenAI(
                api_key=NO_KEY,
                organization="",
                project="",
                base_url=base_url,
                http_client=self._http,
                max_retries=0,
                timeout=openai.Timeout(
                    self.settings.read_timeout_seconds, connect=self.settings.connect_timeout_seconds
                ),
            )
            self._clients.put(base_url, client)
        return client

    def api_key(self, actor_name: str, spec: specs_pb2.ActorSpec) -> str:
        """The key ``spec`` names, read from the server's environment at each call (``NO_KEY``
        when it names none); ModelError when the variable is unset or empty."""
        if not spec.api_key_env:
            return NO_KEY
        key = self._environ.get(spec.api_key_env, "")
        if not key:
            raise ModelError(
                "model_key_missing",
                f"actor {actor_name!r} reads its API key from the environment variable "
                f"{spec.api_key_env}, which is not set (or empty) in the server's environment",
                {"actor": actor_name, "api_key_env": spec.api_key_env},
            )
        return key

    async def stream(
        self,
        actor_name: str,
        spec: specs_pb2.ActorSpec,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        emit: Emit,
        *,
        cancel: asyncio.Event | None = None,
        max_chars: int | None = None,
        hold: Callable[[int, str], None] | None = None,
    ) -> Turn:
        """One model turn: its text goes to ``emit`` piece by piece as it streams. With
        ``max_chars`` the call stops once the answer grows past it (the turn comes back
        with ``finish_reason`` ``"length_budget"``). With ``hold``, the text not yet published
        when the answer ends goes to ``hold`` instead (index, text), for the caller to publish
        first thing in its next write: one write less per turn."""
        verdict = self.egress.verdict(spec.base_url, spec.api_key_env)
        if verdict.field is not None:
            raise ModelError(
                "model_endpoint_refused",
                f"actor {actor_name!r} cannot be used on this server: {verdict.field}: {verdict.problem}",
                {"actor": actor_name, "field": verdict.field},
            )
        call = _Call(self, actor_name, spec, verdict.url, messages, tools, emit, max_chars, hold)
        if cancel is None:
            return await call.run()
        work = asyncio.ensure_future(call.run())
        stop = asyncio.ensure_future(cancel.wait())
        try:
            await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            work.cancel()
            raise
        finally:
            stop.cancel()
        if work.done():
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        raise ModelCancelledError()


class _Call:
    """One turn against one server: attempts, the stream, its pieces."""

    def __init__(
        self,
        models: ChatModels,
        actor_name: str,
        spec: specs_pb2.ActorSpec,
        url: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        emit: Emit,
        max_chars: int | None,
        hold: Callable[[int, str], None] | None = None,
    ) -> None:
        self.models = models
        self.settings = models.settings
        self.actor = actor_name
        self.spec = spec
        # The URL requests go to: the checked, normalised one when endpoints are restricted.
        self.url = url
        self.messages = messages
        self.tools = tools
        self.emit = emit
        self.max_chars = max_chars
        self.hold = hold
        self.where = f"the model server of actor {actor_name!r} ({spec.base_url})"
        self.key = ""
        self._masker = SecretMask("")

    def _details(self, **more: object) -> dict[str, object]:
        return {"actor": self.actor, "base_url": self.spec.base_url, **more}

    def _mask(self, text: str) -> str:
        """The text with the key masked, if the server echoed it, part of it or an encoding
        of it (``secret_mask``); bounded first, so a huge body costs no more than a quote."""
        return self._masker(text[:MASKED_CHARS])

    def _quote(self, text: object) -> str:
        """Upstream text fit to quote: bounded, and with the key masked."""
        return self._mask(str(text or ""))[:QUOTED_CHARS]

    @traced("model.call", lambda self: {"acp.model": self.spec.model})
    async def run(self) -> Turn:
        self.key = self.models.api_key(self.actor, self.spec)
        self._masker = SecretMask(self.key if self.key != NO_KEY else "")
        try:
            return await self._attempts()
        finally:
            self.key = ""

    async def _attempts(self) -> Turn:
        attempt = 0
        while True:
            pump = DeltaPump(self.emit)
            try:
                return await self._once(pump)
            except _RetryableError as retry:
                pump.abandon()
                if attempt >= self.settings.retries:
                    raise retry.failure(f"; gave up after {attempt + 1} attempts") from None
                delay = self._delay(attempt, retry.retry_after)
                if delay is None:
                    raise retry.failure(
                        f"; it asked to retry after {retry.retry_after:g} s, more than the "
                        f"{self.settings.max_retry_after_seconds:g} s this server waits"
                    ) from None
                log.warning(
                    "model call of actor %s failed (%s); retrying in %.2f s (attempt %d of %d)",
                    self.actor,
                    retry.summary,
                    delay,
                    attempt + 2,
                    self.settings.retries + 1,
                )
                await self.models.sleep(delay)
                attempt += 1
            except BaseException:
                pump.abandon()
                raise

    def _delay(self, attempt: int, retry_after: float | None) -> float | None:
        if retry_after is not None:
            return retry_after if retry_after <= self.settings.max_retry_after_seconds else None
        delay: float = min(self.settings.backoff_seconds * (2**attempt), self.settings.max_backoff_seconds)
        return delay

    def _request(self) -> dict[str, Any]:
        """``create``'s arguments. The body goes as ``extra_body``, which the library sends as
        given: as typed parameters, the messages and tools (already plain JSON here) would
        first be walked through the library's type-driven transform, ~0.4 ms a turn. Its
        ``messages`` replaces the empty list the required parameter is given."""
        body: dict[str, Any] = {
            "messages": list(self.messages),
            "stream_options": {"include_usage": True},
        }
        if self.tools:
            body["tools"] = list(self.tools)
        return {"model": self.spec.model, "messages": [], "stream": True, "extra_body": body}

    async def _once(self, pump: DeltaPump) -> Turn:
        # Imported at a model call, as openai is (__init__): every process that opens a
        # facade (each local-mode ``agents`` command) imports this module.
        import httpx2
        import openai

        client = self.models.client(self.url).with_options(api_key=self.key)
        # The raw stream: chunks are decoded here (orjson, plain dicts), several times cheaper
        # than the library's typed chunk objects; the library still sends, retries nothing,
        # and turns statuses into its errors.
        opened = client.chat.completions.with_streaming_response.create(**self._request())
        try:
            response = await opened.__aenter__()
        except openai.APIStatusError as exc:
            raise self._status_failure(exc) from None
        except openai.APITimeoutError:
            raise _RetryableError(self._unavailable("did not answer in time"), "timeout") from None
        except openai.APIConnectionError as exc:
            raise _RetryableError(
                self._unavailable(f"could not be reached ({self._cause(exc)})"), "connection"
            ) from None
        builder = TurnBuilder()
        reader = SSEReader()
        lines = response.iter_lines()
        try:
            async for line in lines:
                try:
                    chunk = reader.line(line)
                except StreamEndError:
                    await _drain(lines)
                    break
                if chunk is None:
                    continue
                text = builder.add(chunk)
                if text:
                    pump.push(text)
                    if self.max_chars is not None and builder.chars > self.max_chars:
                        await pump.close()
                        turn = builder.cut()
                        turn.finish_reason = "length_budget"
                        return turn
            # After [DONE] nothing is pending: this is for a body that ended without it.
            if reader.pending:
                builder.add(reader.line(""))
        except httpx2.TimeoutException:
            failure = self._unavailable(
                f"went silent for {self.settings.read_timeout_seconds:g} s in the middle of its answer"
            )
            raise self._after_start(pump, failure, "read timeout") from None
        except httpx2.TransportError as exc:
            failure = ModelError(
                "model_stream_broken",
                f"{self.where} broke off its answer ({self._quote(exc) or type(exc).__name__})",
                self._details(),
            )
            raise self._after_start(pump, failure, "connection lost") from None
        except ModelError as exc:
            raise ModelError(
                exc.reason, f"{self.where}: {self._mask(exc.message)}", self._details()
            ) from None
        finally:
            await opened.__aexit__(None, None, None)
        turn = builder.finish()
        if self.hold is None:
            await pump.close()
        else:
            tail = await pump.hold()
            if tail is not None:
                self.hold(*tail)
        return turn

    def _after_start(self, pump: DeltaPump, failure: ModelError, summary: str) -> Exception:
        """Retry only when nothing of the answer reached anyone yet."""
        if pump.count == 0 and not pump.pending:
            return _RetryableError(failure, summary)
        return failure

    @staticmethod
    def _cause(exc: BaseException) -> str:
        cause = exc.__cause__ or exc.__context__
        text = str(cause) if cause is not None else str(exc)
        return text[:QUOTED_CHARS] or type(cause or exc).__name__

    def _unavailable(self, what: str) -> ModelError:
        return ModelError("model_unavailable", f"{self.where} {what}", self._details())

    def _status_failure(self, exc: openai.APIStatusError) -> Exception:
        status = exc.status_code
        if status in (401, 403):
            # The body may quote part of the key (OpenAI's does): it is not repeated.
            return ModelError(
                "model_key_refused",
                f"{self.where} refused the API key (HTTP {status}); check the environment variable "
                f"{self.spec.api_key_env or '(none: the actor names no api_key_env)'}",
                self._details(status=status, api_key_env=self.spec.api_key_env),
            )
        said = self._quote(_error_message(exc))
        if status == 429 or status >= 500 or status == 408:
            reason = "model_rate_limited" if status == 429 else "model_unavailable"
            failure = ModelError(
                reason, f"{self.where} answered HTTP {status}: {said}", self._details(status=status)
            )
            return _RetryableError(failure, f"HTTP {status}", _retry_after(exc.response.headers))
        return ModelError(
            "model_request_refused",
            f"{self.where} refused the request (HTTP {status}): {said}",
            self._details(status=status, model=self.spec.model),
        )


class _RetryableError(Exception):
    def __init__(self, failure: ModelError, summary: str, retry_after: float | None = None) -> None:
        super().__init__(failure.message)
        self._failure = failure
        self.summary = summary
        self.retry_after = retry_after

    def failure(self, suffix: str) -> ModelError:
        return ModelError(self._failure.reason, self._failure.message + suffix, self._failure.details)


def _error_message(exc: openai.APIStatusError) -> str:
    body = exc.body
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return exc.message


def _retry_after(headers: Any) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date)."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            value = float(raw) / scale
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = headers.get("retry-after")
    if raw:
        parsed = email.utils.parsedate_tz(raw)
        if parsed is not None:
            return max(0.0, email.utils.mktime_tz(parsed) - time.time())
    return None


async def _drain(lines: AsyncIterator[str]) -> None:
    """Read what follows ``[DONE]`` to the end of the body, a bounded amount, so the
    connection is reused by the next turn: left unread, closing the response closes the
    connection, and every turn would pay a new one (a TLS handshake, for a hosted model).
    Past the bound, or on any failure, the connection is simply closed."""
    import httpx2  # imported at a model call (see ``_once``)

    try:
        async with asyncio.timeout(DRAIN_SECONDS):
            read = 0
            async for _ in lines:
                read += 1
                if read >= DRAIN_LINES:
                    return
    except (TimeoutError, httpx2.HTTPError, httpx2.StreamError):
        return
