"""Issue 17, finding 6 over the wires: 400 unauthenticated requests with ~3 MB tokens took a
real server from 65 MB to 1,245 MB (every unknown token was kept). A token over
MAX_TOKEN_CHARS is refused unhashed (AUTH_REQUIRED, ``TOKEN_TOO_LONG``) on every transport, and
a real ``agents serve`` fed many huge tokens keeps its memory."""

from __future__ import annotations

import pathlib

import httpx
import orjson
import pytest

from cleveragents.acp.facade import auth
from tests.conformance.harness import Run, run_everywhere
from tests.server_process import Tokens, start_server

# What the finding sent (a little under the 4 MiB body limit with its envelope).
HUGE = "acp_" + "x" * 3_000_000
REQUESTS = 100


async def too_long(run: Run) -> None:
    long_token = "acp_" + "x" * auth.MAX_TOKEN_CHARS
    err = await run.fails(run.client(long_token).call("session.list"), "AUTH_REQUIRED", "TOKEN_TOO_LONG")
    assert err.details["max_chars"] == auth.MAX_TOKEN_CHARS
    await run.client("alice").call("session.list")


async def test_a_token_over_the_limit_is_refused_unhashed_on_every_transport(tmp_path: pathlib.Path) -> None:
    await run_everywhere(too_long, tmp_path, Tokens.create(tmp_path))


def rss_bytes(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not pathlib.Path("/proc/self/status").exists(), reason="reads /proc for the RSS")
def test_huge_tokens_leave_a_real_servers_memory_alone(tmp_path: pathlib.Path) -> None:
    """100 envelopes with a 3 MB ``auth.token`` each: before, each was kept (300 MB more);
    now the server's resident memory grows by far less than one copy per request."""
    tokens = Tokens.create(tmp_path)
    server = start_server(tmp_path, tokens=tokens.path)
    try:
        body = orjson.dumps({"operation": "session.list", "auth": {"token": HUGE}})
        with httpx.Client(base_url=server.http, timeout=30) as http:

            def refused() -> None:
                answer = http.post("/api/v1/acp", content=body)
                assert answer.status_code == 401, answer.text[:200]
                assert answer.json()["error"]["details"]["refinement"] == "TOKEN_TOO_LONG"

            # Warm up: the allocator's arenas for bodies of this size exist before measuring.
            for _ in range(5):
                refused()
            before = rss_bytes(server.process.pid)
            for _ in range(REQUESTS):
                refused()
            grown = rss_bytes(server.process.pid) - before
            assert (
                http.post(
                    "/api/v1/acp",
                    json={"operation": "session.list"},
                    headers={"Authorization": f"Bearer {tokens.tokens['alice']}"},
                ).json()["status"]
                == "ok"
            )
        # Kept tokens would be REQUESTS * 3 MB = 300 MB; allow a few bodies of slack.
        assert grown < 20 * len(HUGE), f"the server grew by {grown / 1e6:.0f} MB"
        print(f"RSS grew by {grown / 1e6:.1f} MB over {REQUESTS} requests with 3 MB tokens")
    finally:
        assert server.stop() == 0, server.stderr()
