"""Live events in Chromium: the console's event panel across a server killed and restarted
(nothing lost, nothing shown twice), and an EventSource page on another origin opening
its stream with a ticket under the server's CORS origins."""

from __future__ import annotations

import http.server
import pathlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from cleveragents.acp.contract import sse
from tests.gateway.web.conftest import Console, watch
from tests.server_process import Children, ServerProcess, Tokens, start_server

FOREIGN = pathlib.Path(__file__).parent / "foreign"
WAIT = 30.0


def server_sequences(server: ServerProcess, token: str) -> list[int]:
    """Every retained event's sequence, read over SSE until the backlog is exhausted (the
    first keep-alive after the last frame)."""
    parser = sse.Parser()
    found: list[int] = []
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.stream("GET", server.http + "/api/v1/events/stream", headers=headers, timeout=10) as response:
        for line in response.iter_lines():
            if line.startswith(": keep-alive"):
                return found
            for frame in parser.feed(line):
                found.append(int(frame.id or 0))
    return found


def panel_sequences(page: Any) -> list[int]:
    return [
        int(s)
        for s in page.evaluate(
            "[...document.querySelectorAll('#event-rows tr')].map(r => r.dataset.sequence)"
        )
    ]


def wait_until(condition: Any, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout}s: {what}")


def chat(console: Console, session_id: str, *texts: str) -> None:
    for text in texts:
        console.call("session.tell", {"session_id": session_id, "content": text})


def test_the_event_panel_resumes_across_a_restart_with_nothing_lost_or_repeated(console: Console) -> None:
    page = console.page
    console.sign_in()
    page.goto(console.url + "#/events")
    page.wait_for_selector("#feed-state[data-state=live]")
    session_id = console.call("session.create", {"title": "events"})["session"]["meta"]["id"]
    chat(console, session_id, "one", "two")
    expected = server_sequences(console.server, console.token())
    wait_until(lambda: sorted(panel_sequences(page)) == expected, "the first events in the panel")
    console.shot("events")

    port = urlsplit(console.server.http).port
    assert console.server.stop(signal.SIGKILL) == -signal.SIGKILL
    page.wait_for_selector("#feed-state:not([data-state=live])")
    console.server = console.children.server(
        start_server(console.directory, "--http-port", str(port), tokens=console.tokens.path)
    )
    chat(console, session_id, "three", "four")
    page.wait_for_selector("#feed-state[data-state=live]", timeout=WAIT * 1000)
    chat(console, session_id, "five")
    expected = server_sequences(console.server, console.token())
    wait_until(lambda: sorted(panel_sequences(page)) == expected, "every event once after the restart")
    shown = panel_sequences(page)
    assert len(shown) == len(set(shown))
    assert page.locator("#event-rows tr[data-type='session.message']").count() == 10
    network = [p for p in console.problems if "net::ERR_" in p or "Failed to load resource" in p]
    assert console.problems == network


class ForeignPage(http.server.SimpleHTTPRequestHandler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, directory=str(FOREIGN), **kwargs)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def foreign_origin() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), ForeignPage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_an_eventsource_page_on_another_origin_uses_a_ticket(
    browser: Any, foreign_origin: str, tmp_path: pathlib.Path, children: Children
) -> None:
    tokens = Tokens.create(tmp_path)
    server = children.server(start_server(tmp_path, "--cors-origin", foreign_origin, tokens=tokens.path))
    token = tokens.tokens["alice"]
    context = browser.new_context()
    problems: list[str] = []
    try:
        page = context.new_page()
        watch(page, problems)
        created = httpx.post(
            server.http + "/api/v1/acp",
            json={"operation": "session.create"},
            headers={"Authorization": f"Bearer {token}"},
        ).json()
        session_id = created["data"]["session"]["meta"]["id"]
        page.goto(foreign_origin + "/index.html")
        assert urlsplit(server.http).netloc != urlsplit(foreign_origin).netloc
        page.evaluate("([acp, token, id]) => follow(acp, token, id)", [server.http, token, session_id])
        page.wait_for_selector("#state:text-is('open')")
        for text in ("<b>one</b>", "two"):
            httpx.post(
                server.http + "/api/v1/acp",
                json={"operation": "session.tell", "params": {"session_id": session_id, "content": text}},
                headers={"Authorization": f"Bearer {token}"},
            )
        page.wait_for_selector("#events li:text-is('<b>one</b>')")
        wait_until(lambda: len(page.evaluate("window.seen")) == 4, "both messages and their replies")
        seen = page.evaluate("window.seen")
        assert seen == sorted(set(seen))
        assert page.evaluate("document.querySelectorAll('#events b').length") == 0
        assert problems == []
    finally:
        context.close()
    assert server.stop() == 0, server.stderr()


def test_an_origin_the_server_does_not_name_gets_no_ticket(
    browser: Any, foreign_origin: str, tmp_path: pathlib.Path, children: Children
) -> None:
    tokens = Tokens.create(tmp_path)
    server = children.server(
        start_server(tmp_path, "--cors-origin", "http://127.0.0.1:9", tokens=tokens.path)
    )
    context = browser.new_context()
    try:
        page = context.new_page()
        page.goto(foreign_origin + "/index.html")
        outcome = page.evaluate(
            "([acp, token]) => ticket(acp, token, '').then(() => 'issued', (e) => e.name)",
            [server.http, tokens.tokens["alice"]],
        )
        assert outcome == "TypeError"
    finally:
        context.close()
    assert server.stop() == 0, server.stderr()
