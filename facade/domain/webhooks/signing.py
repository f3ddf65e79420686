"""Standard Webhooks signatures (https://www.standardwebhooks.com): a secret is ``whsec_``
and the base64 of 32 random bytes; a message is signed as ``v1,`` and the base64 of the
HMAC-SHA256 of ``{webhook-id}.{webhook-timestamp}.{body}`` under the key. Several
signatures travel space-separated in one ``webhook-signature`` header: during a rotation's
overlap the old secret signs beside the new one, so a receiver holding either verifies."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Iterable

PREFIX = "whsec_"
KEY_BYTES = 32


def new_secret() -> str:
    return PREFIX + base64.b64encode(secrets.token_bytes(KEY_BYTES)).decode()


def key_of(secret: str) -> bytes:
    return base64.b64decode(secret.removeprefix(PREFIX))


def sign(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` signature."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(key_of(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secrets_: Iterable[str], message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three headers of a message, signed with every secret given (newest first)."""
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(sign(secret, message_id, timestamp, body) for secret in secrets_),
    }
