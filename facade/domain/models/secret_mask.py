"""Masking a model API key in text a model server sent back, before any of it reaches a
tenant (an error message, a quoted body).

A server that echoes the key rarely echoes it whole: OpenAI's own refusal shows its first
and last characters, a proxy may log it base64-encoded (``Authorization: Basic``), hex or
percent-encoded. So the mask hides every run of ``MIN_RUN`` or more characters that also
occurs in the key or in one of its encodings, not only the exact key.
"""

from __future__ import annotations

import base64
import binascii
import urllib.parse

# A run this long taken from the key (or an encoding of it) is masked. Shorter runs are
# ordinary text ("sk-", "-proj"); a key shorter than this is masked only whole.
MIN_RUN = 8
MASK = "***"


def _encodings(key: str) -> list[str]:
    """The key as a server might echo it: raw, base64 (standard and URL-safe, at each of the
    three offsets it can take inside a longer encoded value), hex, percent-encoded."""
    raw = key.encode()
    found = {key, binascii.hexlify(raw).decode(), binascii.hexlify(raw).decode().upper()}
    found.add(urllib.parse.quote(key, safe=""))
    for offset in range(3):
        padded = b"\0" * offset + raw
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            encoded = encode(padded).decode().rstrip("=")
            # The characters that mix the padding (or what follows) with the key are dropped.
            lead = (offset * 4 + 2) // 3
            found.add(encoded[lead:-2] if len(encoded) > lead + 2 else "")
    return [text for text in found if text]


class SecretMask:
    """Masks one key's runs and encodings in text; made once per model call."""

    def __init__(self, key: str) -> None:
        self._whole = [text for text in _encodings(key) if text] if key else []
        self._runs = {
            text[start : start + MIN_RUN]
            for text in self._whole
            if len(text) >= MIN_RUN
            for start in range(len(text) - MIN_RUN + 1)
        }

    def __call__(self, text: str) -> str:
        if not self._whole or not text:
            return text
        for whole in self._whole:
            if len(whole) < MIN_RUN:
                text = text.replace(whole, MASK)
        if not self._runs or len(text) < MIN_RUN:
            return text
        hidden = bytearray(len(text))
        runs = self._runs
        for start in range(len(text) - MIN_RUN + 1):
            if text[start : start + MIN_RUN] in runs:
                hidden[start : start + MIN_RUN] = b"\1" * MIN_RUN
        if not any(hidden):
            return text
        out: list[str] = []
        index = 0
        while index < len(text):
            if hidden[index]:
                out.append(MASK)
                while index < len(text) and hidden[index]:
                    index += 1
            else:
                out.append(text[index])
                index += 1
        return "".join(out)
