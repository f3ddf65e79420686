"""The store's own figures in /metrics (issue 15): ``acp_store_commit_seconds``,
``acp_store_wait_seconds{access}`` (fed through the store's observer hook from its threads)
and ``acp_store_read_cache_total{result}``, counted exactly for a sequence of calls on a real
server."""

from __future__ import annotations

import httpx

from tests.gateway.observe.test_metrics import Running, call, running, scrape, value

__all__ = ["running"]

CREATES = 5
SHOWS = 3


async def test_commits_and_waits_are_counted_per_call(running: Running) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        assert running.server.metrics_url is not None
        metrics = running.server.metrics_url
        before = await scrape(client, metrics)
        created = []
        # One call after another: each write is its own commit (nothing to group it with).
        for index in range(CREATES):
            answer = await call(client, running.http, running.token, "session.create", title=f"s{index}")
            assert answer.status_code == 200, answer.text
            created.append(answer.json()["data"]["session"]["meta"]["id"])
        # Each session twice: read once, then answered from memory (nothing committed between).
        for session_id in created[:SHOWS] + created[:SHOWS]:
            answer = await call(client, running.http, running.token, "session.show", session_id=session_id)
            assert answer.status_code == 200, answer.text
        after = await scrape(client, metrics)

    def grew(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert grew("acp_store_commit_seconds_count") == CREATES
    assert grew("acp_store_wait_seconds_count", access="write") == CREATES
    # The shows, and the read the second scrape makes for its gauges.
    assert grew("acp_store_wait_seconds_count", access="read") == SHOWS + 1
    assert grew("acp_store_read_cache_total", result="miss") == SHOWS
    assert grew("acp_store_read_cache_total", result="hit") == SHOWS
    assert grew("acp_store_commit_seconds_sum") > 0
    # Nothing waits in the buckets' overflow on an idle server: every wait is under 5 s.
    assert value(after, "acp_store_wait_seconds_bucket", access="write", le="5.0") == value(
        after, "acp_store_wait_seconds_count", access="write"
    )
