"""Issue 31, finding 10: a model server that echoed part of the API key (or its base64)
reached tenants; only the exact full key was masked."""

from __future__ import annotations

import base64
import urllib.parse

import pytest

from cleveragents.acp.facade.domain.models.client import ChatModels
from cleveragents.acp.facade.domain.models.failures import ModelError
from cleveragents.acp.facade.domain.models.secret_mask import MIN_RUN, SecretMask
from cleveragents.acp.facade.domain.models.settings import ModelSettings
from tests.facade.models.test_client import KEY, MESSAGES, Pieces, actor
from tests.fake_openai import FakeOpenAI, error

ECHOES = {
    "whole": f"bad key {KEY}",
    "openai's abbreviation": f"Incorrect API key provided: {KEY[:12]}************{KEY[-8:]}.",
    "a middle run": f"key fragment {KEY[5 : 5 + MIN_RUN + 2]} refused",
    "base64": f"Authorization: Basic {base64.b64encode(f'user:{KEY}'.encode()).decode()}",
    "url-safe base64 at offset 1": base64.urlsafe_b64encode(b"x" + KEY.encode()).decode(),
    "base64 at offset 2": base64.b64encode(b"xy" + KEY.encode()).decode(),
    "hex": KEY.encode().hex(),
    "HEX": KEY.encode().hex().upper(),
    "percent-encoded": urllib.parse.quote("k=" + KEY, safe=""),
}


def leaked(text: str) -> list[str]:
    """What of the key, or an encoding of it, is still readable in ``text``."""
    pieces = {KEY, KEY.encode().hex(), KEY.encode().hex().upper(), urllib.parse.quote(KEY, safe="")}
    for prefix in (b"", b"x", b"xy", b"user:"):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(prefix + KEY.encode()).decode()
            pieces.add(encoded[len(prefix) * 2 : -3])
    runs = {p[i : i + MIN_RUN] for p in pieces for i in range(len(p) - MIN_RUN + 1)}
    return sorted(run for run in runs if run in text)


@pytest.mark.parametrize("how", list(ECHOES))
def test_every_echo_of_the_key_is_masked(how: str) -> None:
    assert leaked(ECHOES[how]), "the test's own check must see the leak"
    masked = SecretMask(KEY)(ECHOES[how])
    assert leaked(masked) == [], masked
    assert "***" in masked


def test_ordinary_text_and_short_keys() -> None:
    text = "model 'gpt-4o-mini' not found; see https://example.invalid/docs"
    assert SecretMask(KEY)(text) == text
    assert SecretMask("")(text) == text
    assert (
        SecretMask("abc123")("the key abc123 is wrong; abc12 is not it")
        == "the key *** is wrong; abc12 is not it"
    )


@pytest.mark.parametrize("how", ["openai's abbreviation", "base64"])
async def test_a_refusal_quoting_part_of_the_key_reaches_nobody(how: str) -> None:
    models = ChatModels(ModelSettings(retries=0), {"TEST_KEY": KEY})
    async with FakeOpenAI() as fake:
        fake.then(error(404, ECHOES[how], kind="invalid_request_error"))
        with pytest.raises(ModelError) as info:
            await models.stream("a", actor(fake), MESSAGES, [], Pieces())
    await models.close()
    failure = info.value.to_acp()
    assert leaked(failure.message) == [], failure.message
    assert leaked(repr(failure.details)) == [], failure.details
