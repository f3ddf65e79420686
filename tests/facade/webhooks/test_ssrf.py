"""SSRF: what a webhook may reach is the operator's, checked when it is added and again at
connect time, on the address actually connected to. URLs that resolve to loopback, the
metadata address, private networks or ::1 are refused at ``webhook.add``, plain http
unless allowed, a DNS answer that changed to loopback after the add is refused at delivery,
and a redirect is never followed: listeners counting connections show none was opened to a
refused address. A slow receiver holds up only its own subscription."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import socket
from collections.abc import AsyncIterator, Iterator

import pytest

from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.acp_client import ACPClient
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.access.policy import Policy
from cleveragents.acp.facade.domain.access.webhook_egress import WebhookEgress
from cleveragents.acp.v1 import webhook_pb2
from tests.facade.webhooks.helpers import delivering, event_log, fast_retries, log_events
from tests.facade.webhooks.receiver import Received, Receiver


class CountingListener:
    """A TCP listener that counts the connections made to it (and accepts them)."""

    def __init__(self, host: str) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.bind((host, 0))
        self.sock.listen(16)
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]

    @property
    def connections(self) -> int:
        count = 0
        while True:
            try:
                conn, _ = self.sock.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def listening(host: str) -> Iterator[CountingListener]:
    try:
        listener = CountingListener(host)
    except OSError as exc:
        pytest.skip(f"cannot listen on {host}: {exc}")
    try:
        yield listener
    finally:
        listener.close()


@pytest.fixture
async def strict(db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[ACPClient]:
    """An operator who allows plain http (to reach the listeners) but no extra network."""
    fast_retries(monkeypatch)
    facade = delivering(db_path, Policy.server(webhook_allow_http=True))
    client = ACPClient(LocalTransport(facade))
    yield client
    await client.close()
    await facade.close()


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:{port}/hook"),
        ("127.0.0.1", "http://localhost:{port}/hook"),
        ("::1", "http://[::1]:{port}/hook"),
        ("127.0.0.1", "http://[::ffff:127.0.0.1]:{port}/hook"),
        (None, "http://169.254.169.254/latest/meta-data/"),
        (None, "http://10.0.0.1/hook"),
        (None, "http://0.0.0.0:{port}/hook"),
    ],
)
async def test_add_refuses_addresses_outside_the_allow_list(
    strict: ACPClient, host: str | None, url: str
) -> None:
    with contextlib.ExitStack() as stack:
        listener = stack.enter_context(listening(host)) if host else None
        target = url.format(port=listener.port if listener else 80)
        with pytest.raises(ACPError) as refused:
            await strict.ops.webhook.add(name="ssrf", url=target)
        assert refused.value.code == "INVALID_PARAMS"
        assert refused.value.details["refinement"] == "WEBHOOK_ADDRESS_REFUSED"
        assert refused.value.details["field"] == "url"
        assert "--webhook-allow-network" in refused.value.message
        if listener is not None:
            assert listener.connections == 0
    assert not (await strict.ops.webhook.list()).webhooks


async def test_https_only_unless_the_operator_allows_http(db_path: pathlib.Path) -> None:
    facade = delivering(db_path, Policy.server(webhook_allow_networks=["127.0.0.1/32"]))
    client = ACPClient(LocalTransport(facade))
    try:
        with pytest.raises(ACPError) as refused:
            await client.ops.webhook.add(name="plain", url="http://127.0.0.1:9/hook")
        assert refused.value.details["refinement"] == "WEBHOOK_HTTP_REFUSED"
        assert "--webhook-allow-http" in refused.value.message
        for bad in ("https://user@127.0.0.1/x", "https://127.0.0.1/a/../b", "ftp://127.0.0.1/"):
            with pytest.raises(ACPError) as invalid:
                await client.ops.webhook.add(name="bad", url=bad)
            assert invalid.value.details["refinement"] == "WEBHOOK_URL_INVALID"
    finally:
        await client.close()
        await facade.close()


async def test_a_redirect_to_loopback_is_not_followed(
    db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast_retries(monkeypatch, max_failures=2)
    facade = delivering(
        db_path, Policy.server(webhook_allow_http=True, webhook_allow_networks=["127.0.0.1/32"])
    )
    client = ACPClient(LocalTransport(facade))
    try:
        with listening("127.0.0.2") as inner:
            location = f"http://127.0.0.2:{inner.port}/admin"
            async with Receiver(lambda _: (302, b"", {"Location": location})) as receiver:
                await client.ops.webhook.add(name="redirect", url=receiver.url())
                watch = client.subscribe(event_type=["webhook.disabled"])
                await event_log(facade).append(log_events(1))
                await anext(aiter(watch))
            assert inner.connections == 0
        history = (await client.ops.webhook.deliveries(name="redirect")).deliveries
        assert [d.response_code for d in history] == [302, 302]
        assert all("redirects are not followed" in d.error and location in d.error for d in history)
    finally:
        await client.close()
        await facade.close()


async def test_a_name_resolving_to_loopback_at_delivery_is_refused(
    db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DNS rebinding: the name resolved to a public address when the webhook was added, to
    loopback when it is delivered. The resolver is the test's (a true external edge: DNS)."""
    fast_retries(monkeypatch, max_failures=2)
    answers = {"hooks.example": ["93.184.215.14"]}

    async def resolver(host: str, port: int) -> list[str]:
        return answers[host]

    policy = Policy.server()
    policy.webhooks = WebhookEgress(allow_http=True, resolver=resolver)
    facade = delivering(db_path, policy)
    client = ACPClient(LocalTransport(facade))
    try:
        with listening("127.0.0.1") as listener:
            await client.ops.webhook.add(name="rebind", url=f"http://hooks.example:{listener.port}/hook")
            answers["hooks.example"] = ["127.0.0.1"]
            watch = client.subscribe(event_type=["webhook.disabled"])
            await event_log(facade).append(log_events(1))
            await anext(aiter(watch))
            assert listener.connections == 0
        history = (await client.ops.webhook.deliveries(name="rebind")).deliveries
        assert {d.result for d in history} == {webhook_pb2.WEBHOOK_DELIVERY_RESULT_REFUSED}
        assert all("127.0.0.1, a loopback address" in d.error for d in history)
        # Several answers: one refused address refuses the name.
        answers["hooks.example"] = ["93.184.215.14", "10.1.2.3"]
        with pytest.raises(ACPError) as refused:
            await client.ops.webhook.add(name="mixed", url="http://hooks.example/hook")
        assert refused.value.details["refinement"] == "WEBHOOK_ADDRESS_REFUSED"
    finally:
        await client.close()
        await facade.close()


async def test_a_slow_receiver_holds_up_only_its_own_subscription(
    db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A receiver that takes 30 s a request: the other subscription gets every event and
    the API answers while the slow one still waits for its first answer."""
    fast_retries(monkeypatch)
    facade = delivering(db_path)
    client = ACPClient(LocalTransport(facade))
    release = asyncio.Event()

    async def slow(_: Received) -> tuple[int, bytes, dict[str, str]]:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(release.wait(), 30)
        return 200, b"", {}

    try:
        async with Receiver(slow) as lagging, Receiver() as fast:
            await client.ops.webhook.add(name="slow", url=lagging.url())
            await client.ops.webhook.add(name="fast", url=fast.url())
            await event_log(facade).append(log_events(50))
            await fast.wait_for(lambda: len(fast.requests) >= 50)
            listed = await client.ops.webhook.list()
            assert {w.name for w in listed.webhooks} == {"slow", "fast"}
            assert lagging.connections == 1
            assert not lagging.requests
            release.set()
            await lagging.wait_for(lambda: len(lagging.requests) >= 50)
    finally:
        await client.close()
        await facade.close()
