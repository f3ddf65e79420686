"""``agents webhook``: add shows the secret once, test sends a signed message to a real
receiver on loopback (verified with ``standardwebhooks``), deliveries lists it, remove
removes; a refused URL is INVALID_PARAMS's exit status with the refusal's message."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest
import standardwebhooks

from cleveragents.acp.contract.errors import TABLE
from tests.client.cli.conftest import Cli


class _Handler(http.server.BaseHTTPRequestHandler):
    received: ClassVar[list[tuple[dict[str, str], bytes]]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    received: list[tuple[dict[str, str], bytes]] = []
    handler = type("Handler", (_Handler,), {"received": received})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    finally:
        server.shutdown()
        server.server_close()


def test_webhook_commands(local_cli: Cli, receiver: tuple[str, list[tuple[dict[str, str], bytes]]]) -> None:
    url, received = receiver
    refused = local_cli("webhook", "add", "meta", "https://169.254.169.254/", expect=None)
    assert refused.status == TABLE["INVALID_PARAMS"].exit_code
    assert "169.254.169.254, a link-local (cloud metadata) address" in refused.error
    local_cli.env["ACP_WEBHOOK_ALLOW_HTTP"] = "1"
    local_cli.env["ACP_WEBHOOK_ALLOW_NETWORKS"] = "127.0.0.1/32"
    added = local_cli("webhook", "add", "ci", url, "--filter", '{"event_type": ["plan.created"]}')
    secret = next(line.split()[-1] for line in added.out.splitlines() if line.startswith("secret:"))
    assert secret.startswith("whsec_")
    tested = local_cli("webhook", "test", "ci")
    assert "result: succeeded" in tested.out
    headers, body = received[0]
    assert standardwebhooks.Webhook(secret).verify(body, headers)["type"] == "webhook.test"
    history = local_cli("webhook", "deliveries", "ci").out
    row = next(line.split() for line in history.splitlines() if line.startswith(headers["webhook-id"]))
    assert row[4:6] == ["succeeded", "204"]
    assert secret not in local_cli("webhook", "remove", "ci").out
    assert local_cli("webhook", "show", "ci", expect=None).status == TABLE["NOT_FOUND"].exit_code
