"""The console's webhooks view (ACP 1.3): subscriptions to a real loopback receiver with
their health; one subscription's delivery history after events happen, its Test and
Disable/Enable buttons; a receiver answering 410 shows its subscription disabled live (the
shell's feed brings webhook.disabled); no secret ever appears on the page."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from tests.gateway.web.conftest import Console


@pytest.fixture
def server_options() -> tuple[tuple[str, ...], dict[str, str]]:
    # The operator lets webhooks reach loopback over http (docs/webhooks.md, SSRF); changes
    # are seen within 100 ms.
    return ("--webhook-allow-http", "--webhook-allow-network", "127.0.0.1/32"), {
        "ACP_WEBHOOK_SCAN_SECONDS": "0.1"
    }


class Receiver(http.server.BaseHTTPRequestHandler):
    """/ok answers 200 "thanks", /gone 410; every request is kept by path."""

    got: ClassVar[dict[str, list[bytes]]] = {}

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.got.setdefault(self.path, []).append(body)
        status, content = (200, b"thanks") if self.path == "/ok" else (410, b"gone for good")
        self.send_response(status)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[str]:
    Receiver.got = {}
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_deliveries_show_and_a_gone_receiver_disables_live(console: Console, receiver: str) -> None:
    secrets = [
        console.call("webhook.add", {"name": "ci", "url": f"{receiver}/ok"})["secret"],
        console.call(
            "webhook.add",
            {"name": "old", "url": f"{receiver}/gone", "filter": {"event_type": ["session.updated"]}},
        )["secret"],
    ]
    page = console.page
    console.sign_in()
    page.goto(console.url + "#/webhooks/ci")
    page.wait_for_selector("#webhooks tr[data-name=old][data-enabled=yes]")
    page.wait_for_selector("#no-deliveries")
    assert "session.updated" in (page.text_content("#webhooks tr[data-name=old]") or "")
    # Events happen while the view is open: ci's deliveries appear, and old's receiver
    # answers 410, which disables it: the feed's webhook.disabled shows it, no reload.
    session_id = console.call("session.create", {"title": "hooked"})["session"]["meta"]["id"]
    console.call(
        "session.update", {"session_id": session_id, "session": {"title": "renamed"}, "update_mask": "title"}
    )
    page.wait_for_selector("#webhooks tr[data-name=old][data-enabled=no]")
    assert "410" in (page.text_content("#webhooks tr[data-name=old] .webhook-state") or "")
    page.wait_for_selector("#deliveries tr[data-result=succeeded]")
    row = page.text_content("#deliveries tbody tr") or ""
    assert "200" in row, row
    assert "thanks" in row, row
    assert Receiver.got["/ok"]
    assert len(Receiver.got["/gone"]) == 1
    # Test: one signed webhook.test message now, its answer shown and added to the history.
    page.click("#webhook-test")
    page.wait_for_selector("#webhook-test-result:has-text('succeeded 200')")
    page.wait_for_selector("#deliveries td:text-is('webhook.test')")
    # Disable, then enable at the revision read.
    page.click("#webhook-toggle:text-is('Disable')")
    page.wait_for_selector("#webhooks tr[data-name=ci][data-enabled=no]")
    page.click("#webhook-toggle:text-is('Enable')")
    page.wait_for_selector("#webhooks tr[data-name=ci][data-enabled=yes]")
    assert console.call("webhook.show", {"name": "ci"})["webhook"]["revision"] == 3
    console.shot("webhooks")
    html = page.content()
    assert not any(secret in html for secret in secrets)
    assert "whsec_" not in html
    assert console.problems == []
