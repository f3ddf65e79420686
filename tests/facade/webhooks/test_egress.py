"""The webhook egress rules as functions: which URLs parse, which addresses a subscription
may reach by default and through the operator's networks, IPv4 inside IPv6 judged as the
IPv4 address it carries, and a lookup's answers all checked."""

from __future__ import annotations

import pytest

from cleveragents.acp.facade.domain.access.webhook_egress import AddressRefusedError, WebhookEgress


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "127.8.9.10",
        "::1",
        "169.254.169.254",
        "fe80::1",
        "10.0.0.1",
        "172.16.5.4",
        "192.168.1.1",
        "fc00::5",
        "100.64.0.1",
        "100.100.100.200",
        "0.0.0.0",
        "::",
        "224.0.0.1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "2002:7f00:1::",
        "64:ff9b::a00:1",
    ],
)
def test_non_global_addresses_are_refused_by_default(address: str) -> None:
    with pytest.raises(AddressRefusedError) as refused:
        WebhookEgress().check_address("hooks.example", address)
    assert refused.value.refinement == "WEBHOOK_ADDRESS_REFUSED"


@pytest.mark.parametrize("address", ["93.184.215.14", "2606:4700::6810:84e5", "8.8.8.8"])
def test_global_addresses_are_allowed(address: str) -> None:
    assert str(WebhookEgress().check_address("hooks.example", address)) == address


def test_the_operators_networks_let_addresses_in() -> None:
    egress = WebhookEgress.configured(allow_http=False, allow_networks=["10.1.0.0/16", "::1"])
    assert str(egress.check_address("h", "10.1.2.3")) == "10.1.2.3"
    assert str(egress.check_address("h", "::1")) == "::1"
    with pytest.raises(AddressRefusedError):
        egress.check_address("h", "10.2.0.1")
    with pytest.raises(AddressRefusedError):
        egress.check_address("h", "127.0.0.1")
    with pytest.raises(ValueError, match="--webhook-allow-network 'nope'"):
        WebhookEgress.configured(allow_http=False, allow_networks=["nope"])


@pytest.mark.parametrize(
    ("url", "refinement"),
    [
        ("http://hooks.example/x", "WEBHOOK_HTTP_REFUSED"),
        ("ftp://hooks.example/x", "WEBHOOK_URL_INVALID"),
        ("https://user:pw@hooks.example/x", "WEBHOOK_URL_INVALID"),
        ("https://hooks.example/a/../admin", "WEBHOOK_URL_INVALID"),
        ("https://hooks.example/%2e%2e/admin", "WEBHOOK_URL_INVALID"),
        ("https://0x7f.1/x", "WEBHOOK_URL_INVALID"),
        ("https://2130706433/x", "WEBHOOK_URL_INVALID"),
        ("https://hooks.example/x#frag", "WEBHOOK_URL_INVALID"),
        ("https://hooks.example/x?a b", "WEBHOOK_URL_INVALID"),
        ("https://hooks.example/" + "a" * 3000, "WEBHOOK_URL_INVALID"),
    ],
)
def test_urls_that_could_be_read_two_ways_are_refused(url: str, refinement: str) -> None:
    with pytest.raises(AddressRefusedError) as refused:
        WebhookEgress().check_url(url)
    assert refused.value.refinement == refinement


def test_a_url_keeps_its_path_and_query() -> None:
    target = WebhookEgress().check_url("https://Hooks.Example:8443/in/?token=abc")
    assert (target.host, target.port, target.target, target.host_header) == (
        "hooks.example",
        8443,
        "/in/?token=abc",
        "hooks.example:8443",
    )


async def test_every_answer_of_a_lookup_is_checked() -> None:
    answers = {"hooks.example": ["93.184.215.14", "127.0.0.1"]}

    async def resolver(host: str, port: int) -> list[str]:
        return answers[host]

    egress = WebhookEgress(resolver=resolver)
    target = egress.check_url("https://hooks.example/x")
    with pytest.raises(AddressRefusedError):
        await egress.resolve(target)
    answers["hooks.example"] = ["93.184.215.14"]
    assert str(await egress.resolve(target)) == "93.184.215.14"
    answers["hooks.example"] = []
    with pytest.raises(AddressRefusedError) as unresolved:
        await egress.resolve(target)
    assert unresolved.value.refinement == "WEBHOOK_UNRESOLVED"
