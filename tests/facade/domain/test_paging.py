"""``Pager``: the one paging helper every list uses (sessions, plans, registries)."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator

import pytest

from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.paging import DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE, Pager
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import session_pb2

ITEMS = [f"{i:04d}" for i in range(1200)]
FILTERS = {"state": "active"}


@pytest.fixture
def pager(db_path: pathlib.Path) -> Iterator[Pager]:
    store = SQLiteStore(db_path)
    yield Pager(store)
    store.close()


def fetch_from(items: list[str]) -> Callable[[str | None, int], list[str]]:
    def fetch(after: str | None, limit: int) -> list[str]:
        return [item for item in items if after is None or item > after][:limit]

    return fetch


fetch = fetch_from(ITEMS)


def page(
    pager: Pager, size: int = 0, token: str = "", filters: dict[str, str] = FILTERS
) -> tuple[list[str], str]:
    request = session_pb2.ListSessionsRequest(page_size=size, page_token=token)
    return pager.page("test.list", filters, request, fetch, lambda item: item)


def test_pages_cover_the_list_once_and_the_last_has_no_token(pager: Pager) -> None:
    seen: list[str] = []
    token = ""
    while True:
        items, token = page(pager, 500, token)
        seen.extend(items)
        if not token:
            break
    assert seen == ITEMS
    assert len(items) == 200


def test_a_page_ends_the_list_exactly_when_nothing_follows(pager: Pager) -> None:
    """The limit+1 fetch: a page as long as the rest of the list carries no token."""
    short = ITEMS[:10]
    request = session_pb2.ListSessionsRequest(page_size=10)
    assert pager.page("test.list", FILTERS, request, fetch_from(short), str) == (short, "")
    request.page_size = 9
    items, token = pager.page("test.list", FILTERS, request, fetch_from(short), str)
    assert (items, bool(token)) == (short[:9], True)
    request.page_token = token
    assert pager.page("test.list", FILTERS, request, fetch_from(short), str) == (short[9:], "")


def test_page_size_rules(pager: Pager) -> None:
    assert len(page(pager)[0]) == DEFAULT_PAGE_SIZE
    assert len(page(pager, MAX_PAGE_SIZE + 1)[0]) == MAX_PAGE_SIZE
    with pytest.raises(ACPError, match="page_size must not be negative"):
        page(pager, -1)


def test_a_token_is_bound_to_its_scope_and_filters(pager: Pager) -> None:
    _, token = page(pager, 10)
    with pytest.raises(ACPError, match="page_token is not valid") as info:
        page(pager, 10, token, {"state": "closed"})
    assert info.value.details["field"] == "page_token"
    request = session_pb2.ListSessionsRequest(page_size=10, page_token=token)
    with pytest.raises(ACPError, match="page_token is not valid"):
        pager.page("other.list", FILTERS, request, fetch, lambda item: item)
    with pytest.raises(ACPError, match="page_token is not valid"):
        page(pager, 10, token[:-2] + ("A" if token[-2] != "A" else "B") + token[-1])
