"""Where webhooks may send: the operator's rules, checked when a subscription is added and
again at every delivery, at connect time.

A URL is ``https`` (plain ``http`` only when the operator allows it: ``agents serve
--webhook-allow-http``), with a host, no user info and nothing that could be read two ways
(the rules of ``models.egress.parse``; a query is allowed). Its host is resolved off the
event loop and *every* address it resolves to must be allowed: a global unicast address, or
one inside a network the operator lists (``--webhook-allow-network CIDR``). Loopback,
link-local (169.254.169.254, the cloud metadata address, among them), private, shared
(100.64/10), multicast, reserved and unspecified addresses are refused unless listed; an
IPv4 address inside IPv6 (``::ffff:127.0.0.1``, 6to4, NAT64) is judged as the IPv4 address it
carries. The delivery then connects to the address that was checked (``sender.py``), so no
second lookup can point it elsewhere.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.models.egress import EndpointError, parse

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# host, port -> the addresses the host resolves to (off the loop).
Resolver = Callable[[str, int], Awaitable[list[str]]]

MAX_URL_CHARS = 2048
HOW_TO_ALLOW_HTTP = (
    "the operator allows plain http with `agents serve --webhook-allow-http` ($ACP_WEBHOOK_ALLOW_HTTP)"
)
HOW_TO_ALLOW_NETWORK = (
    "the operator lets a network in with `agents serve --webhook-allow-network CIDR` "
    "(repeatable; $ACP_WEBHOOK_ALLOW_NETWORKS)"
)
ALLOW_HTTP_ENV = "ACP_WEBHOOK_ALLOW_HTTP"
ALLOW_NETWORKS_ENV = "ACP_WEBHOOK_ALLOW_NETWORKS"
# The most addresses of one host that are checked (and the first is connected to).
MAX_ADDRESSES = 32
# A lookup that takes longer is WEBHOOK_UNRESOLVED (retryable).
RESOLVE_SECONDS = 5.0


class AddressRefusedError(Exception):
    """The URL may not be called: the message says why (never the operator's list)."""

    def __init__(self, message: str, refinement: str) -> None:
        super().__init__(message)
        self.refinement = refinement


@dataclass(frozen=True)
class Target:
    """A URL as it will be called: the address checked, and what the request names."""

    scheme: str
    host: str
    port: int
    # Path and query ("/" at least).
    target: str

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


async def system_resolver(host: str, port: int) -> list[str]:
    """``getaddrinfo`` on the loop's executor: a slow DNS server never blocks the loop."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def networks(cidrs: Sequence[str]) -> tuple[Network, ...]:
    found = []
    for cidr in cidrs:
        try:
            found.append(ipaddress.ip_network(cidr.strip(), strict=False))
        except ValueError:
            raise ValueError(
                f"--webhook-allow-network {cidr!r} is not an address or a CIDR network"
            ) from None
    return tuple(found)


def _carried(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, NAT64), else itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


@dataclass
class WebhookEgress:
    allow_http: bool = False
    allowed: tuple[Network, ...] = ()
    resolver: Resolver = field(default=system_resolver, compare=False)

    @classmethod
    def configured(cls, *, allow_http: bool, allow_networks: Sequence[str]) -> WebhookEgress:
        return cls(allow_http=allow_http, allowed=networks(allow_networks))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WebhookEgress:
        """Local mode: ``$ACP_WEBHOOK_ALLOW_HTTP`` (1/true) and ``$ACP_WEBHOOK_ALLOW_NETWORKS``
        (comma-separated CIDRs)."""
        env = os.environ if environ is None else environ
        allow_http = env.get(ALLOW_HTTP_ENV, "").strip().lower() in ("1", "true", "yes", "on")
        listed = [part for part in env.get(ALLOW_NETWORKS_ENV, "").split(",") if part.strip()]
        return cls.configured(allow_http=allow_http, allow_networks=listed)

    def check_url(self, url: str) -> Target:
        """The URL's parts, or AddressRefusedError for one that may never be called."""
        if len(url) > MAX_URL_CHARS:
            raise AddressRefusedError(f"must be at most {MAX_URL_CHARS} characters", "WEBHOOK_URL_INVALID")
        base, _, query = url.partition("?")
        if query and (not query.isascii() or any(c <= " " or c in "\x7f#\\" for c in query)):
            raise AddressRefusedError(
                "has a query that is not plain ASCII without spaces or a fragment", "WEBHOOK_URL_INVALID"
            )
        try:
            endpoint = parse(base)
        except EndpointError as exc:
            raise AddressRefusedError(str(exc), "WEBHOOK_URL_INVALID") from None
        if endpoint.scheme != "https" and not self.allow_http:
            raise AddressRefusedError(f"must be an https:// URL; {HOW_TO_ALLOW_HTTP}", "WEBHOOK_HTTP_REFUSED")
        # The path as given (``parse`` dropped a trailing slash, which a receiver may need).
        path = urlsplit(base).path or "/"
        return Target(endpoint.scheme, endpoint.host, endpoint.port, path + (f"?{query}" if query else ""))

    def check_address(self, host: str, address: str) -> IPAddress:
        try:
            parsed = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            raise AddressRefusedError(
                f"{host} resolved to {address!r}, no IP address", "WEBHOOK_ADDRESS_REFUSED"
            ) from None
        judged = _carried(parsed)
        if any(_within(parsed, net) or _within(judged, net) for net in self.allowed):
            return parsed
        if judged.is_global and not judged.is_multicast:
            return parsed
        raise AddressRefusedError(
            f"{host} resolves to {parsed}, a {_kind(judged)} address webhooks may not reach; "
            + HOW_TO_ALLOW_NETWORK,
            "WEBHOOK_ADDRESS_REFUSED",
        )

    async def resolve(self, target: Target) -> IPAddress:
        """The address to connect to: every address the host resolves to is checked (so a
        name answering a public and a private address is refused), the first is used."""
        try:
            literal = ipaddress.ip_address(target.host)
        except ValueError:
            literal = None
        if literal is not None:
            return self.check_address(target.host, target.host)
        try:
            async with asyncio.timeout(RESOLVE_SECONDS):
                found = await self.resolver(target.host, target.port)
        except TimeoutError:
            raise AddressRefusedError(
                f"{target.host} did not resolve within {RESOLVE_SECONDS:g} s", "WEBHOOK_UNRESOLVED"
            ) from None
        except (OSError, UnicodeError) as exc:
            raise AddressRefusedError(
                f"{target.host} does not resolve ({exc})", "WEBHOOK_UNRESOLVED"
            ) from None
        if not found:
            raise AddressRefusedError(f"{target.host} resolves to no address", "WEBHOOK_UNRESOLVED")
        checked = [self.check_address(target.host, address) for address in found[:MAX_ADDRESSES]]
        return checked[0]


def _within(address: IPAddress, network: Network) -> bool:
    return address.version == network.version and address in network


def _kind(address: IPAddress) -> str:
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local (cloud metadata)"
    if address.is_multicast:
        return "multicast"
    if address.is_unspecified:
        return "unspecified"
    if address.is_private:
        return "private"
    return "non-global"


def refusal(where: str, exc: AddressRefusedError) -> ACPError:
    """At ``webhook.add``/``update``: INVALID_PARAMS on the url field."""
    retryable = exc.refinement == "WEBHOOK_UNRESOLVED"
    return ACPError(
        ErrorCode.INVALID_PARAMS,
        f"{where} {exc}",
        {"field": "url", "retryable": retryable},
        refinement=exc.refinement,
    )
