"""Paging, shared by every paginated list: page-size rules, signed page tokens, and
``Pager.page``, which fetches one item more than the page to know whether another follows.

A token names the list it belongs to (its scope and filters) and where the next page
starts; it is signed with a key kept in the store, so a forged token, or one replayed
against another list or other filters, is INVALID_PARAMS.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.store.base import Record, Store, StoreConflictError

DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
_KEY_KIND = "system"
_KEY_NAME = "page-token-key"

T = TypeVar("T")
# (position the page starts after, or None for the first page; how many items) -> items.
Fetch = Callable[[str | None, int], Sequence[T]]


class PagedRequest(Protocol):
    """What every list request carries (``ListSessionsRequest``, ``ListActorsRequest``...)."""

    @property
    def page_size(self) -> int: ...
    @property
    def page_token(self) -> str: ...


def page_size(requested: int) -> int:
    """0 means the default; above the maximum is clamped; negative is refused."""
    if requested < 0:
        raise ACPError(ErrorCode.INVALID_PARAMS, "page_size must not be negative", {"field": "page_size"})
    if requested == 0:
        return DEFAULT_PAGE_SIZE
    return min(requested, MAX_PAGE_SIZE)


class PageTokens:
    def __init__(self, store: Store) -> None:
        self._key = self._load_key(store)

    @staticmethod
    def _load_key(store: Store) -> bytes:
        existing = store.get_by_name(_KEY_KIND, "", _KEY_NAME)
        if existing is not None:
            return existing.body
        now = time.time()
        record = Record(
            kind=_KEY_KIND,
            id=_KEY_NAME,
            namespace="",
            name=_KEY_NAME,
            body=secrets.token_bytes(32),
            create_time=now,
            update_time=now,
        )
        try:
            store.insert(record)
        except StoreConflictError:
            raced = store.get_by_name(_KEY_KIND, "", _KEY_NAME)
            assert raced is not None
            return raced.body
        return record.body

    def _sign(self, payload: bytes) -> str:
        return hmac.new(self._key, payload, hashlib.sha256).hexdigest()[:32]

    @staticmethod
    def _filters_digest(scope: str, filters: Mapping[str, Any]) -> str:
        canonical = json.dumps([scope, filters], sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def encode(self, scope: str, filters: Mapping[str, Any], position: str) -> str:
        payload = json.dumps(
            {"f": self._filters_digest(scope, filters), "p": position}, separators=(",", ":")
        )
        raw = payload.encode()
        return base64.urlsafe_b64encode(raw + b"." + self._sign(raw).encode()).decode().rstrip("=")

    def decode(self, token: str, scope: str, filters: Mapping[str, Any]) -> str | None:
        """The position a token continues from; None for no token (the first page)."""
        if not token:
            return None
        invalid = ACPError(
            ErrorCode.INVALID_PARAMS,
            "page_token is not valid for this list (forged, corrupted, or from other filters)",
            {"field": "page_token"},
        )
        try:
            blob = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            raw, _, signature = blob.rpartition(b".")
            if not hmac.compare_digest(signature.decode(), self._sign(raw)):
                raise invalid
            payload = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise invalid from None
        if not isinstance(payload, dict) or payload.get("f") != self._filters_digest(scope, filters):
            raise invalid
        position = payload.get("p")
        if not isinstance(position, str):
            raise invalid
        return position


class Pager:
    """Pages of any list: one call gives the page and the token of the next one."""

    def __init__(self, store: Store) -> None:
        self.tokens = PageTokens(store)

    def page(
        self,
        scope: str,
        filters: Mapping[str, Any],
        request: PagedRequest,
        fetch: Fetch[T],
        position: Callable[[T], str],
    ) -> tuple[list[T], str]:
        """The page the request's ``page_token`` continues (the first when empty) and the
        next page's token ("" on the last page). ``fetch`` returns items in list order after
        a position; ``position`` is where an item sits, which the next token carries.
        ``scope`` and ``filters`` are what a token is bound to: every filter of the list."""
        size = page_size(request.page_size)
        found = fetch(self.tokens.decode(request.page_token, scope, filters), size + 1)
        return self._cut(scope, filters, size, found, position)

    async def page_async(
        self,
        scope: str,
        filters: Mapping[str, Any],
        request: PagedRequest,
        fetch: Callable[[str | None, int], Awaitable[Sequence[T]]],
        position: Callable[[T], str],
    ) -> tuple[list[T], str]:
        """``page`` with a ``fetch`` the event loop awaits (a store's ``read_query``)."""
        size = page_size(request.page_size)
        found = await fetch(self.tokens.decode(request.page_token, scope, filters), size + 1)
        return self._cut(scope, filters, size, found, position)

    def _cut(
        self,
        scope: str,
        filters: Mapping[str, Any],
        size: int,
        found: Sequence[T],
        position: Callable[[T], str],
    ) -> tuple[list[T], str]:
        if len(found) <= size:
            return list(found), ""
        return list(found[:size]), self.tokens.encode(scope, filters, position(found[size - 1]))
