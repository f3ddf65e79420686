"""Where model actors may send requests and which of the server's environment variables they
may name as ``api_key_env``: the operator's allow-lists (``agents serve --model-endpoint URL``,
``--model-key-env NAME``). Without them any writer could point an actor at a server it
controls and have this server send it, as the bearer key, the value of any of its variables
(a database URL, a cloud credential), or reach what only this server can (loopback admin
ports, 169.254.169.254, the internal network).

An endpoint is a scheme, host, port and path prefix. URLs are compared after normalisation:
the host lower-cased (an IP address in its one canonical form), the default port filled in,
trailing slashes dropped; a path prefix covers itself and what lies below it (``/v1`` covers
``/v1/x``, never ``/v1evil``). A URL that could be read two ways is refused rather than
normalised: user info, percent escapes, ``.`` or ``..`` segments, backslashes, spaces,
non-ASCII, a query, a fragment, numeric hosts that are not a plain dotted IPv4 address. The
client is then given the normalised URL, so what it connects to is what was checked.

Refusals say which field and how the operator allows more, never what is allowed, nothing
about hosts, and never whether a variable exists.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from cleveragents.acp.contract.recent import Recent

HOW_TO_ALLOW_ENDPOINTS = (
    "the operator allows model endpoints with `agents serve --model-endpoint URL` "
    "(repeatable; model_endpoints in the config file)"
)
HOW_TO_ALLOW_KEY_ENVS = (
    "the operator allows key variables with `agents serve --model-key-env NAME` "
    "(repeatable; model_key_envs in the config file)"
)
ENDPOINT_REFUSED = f"is not one of the model endpoints this server allows; {HOW_TO_ALLOW_ENDPOINTS}"
KEY_ENV_REFUSED = (
    "is not one of the environment variables this server lets actors read a model key from; "
    f"{HOW_TO_ALLOW_KEY_ENVS}"
)
_DEFAULT_PORTS = {"http": 80, "https": 443}
_LABEL = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
_HOST = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# (base_url, api_key_env) verdicts kept: the check runs before every model request.
_VERDICTS = 256


class EndpointError(ValueError):
    """A URL that is no usable model endpoint; the message says why, without the URL."""


@dataclass(frozen=True)
class Endpoint:
    scheme: str
    # A lower-case DNS name, or an IP address in its canonical form (IPv6 without brackets).
    host: str
    port: int
    # "" or "/a/b": no trailing slash.
    path: str

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = "" if _DEFAULT_PORTS[self.scheme] == self.port else f":{self.port}"
        return f"{self.scheme}://{host}{port}{self.path}"

    def covers(self, other: Endpoint) -> bool:
        return (
            self.scheme == other.scheme
            and self.host == other.host
            and self.port == other.port
            and (other.path == self.path or other.path.startswith(self.path + "/"))
        )


def parse(url: str) -> Endpoint:
    """``url`` normalised, or EndpointError for one that could be read more than one way."""
    if not url.isascii() or any(c <= " " or c in "\x7f\\%" for c in url):
        raise EndpointError("must be a plain ASCII URL without spaces, backslashes or percent escapes")
    if "?" in url or "#" in url:
        raise EndpointError("must not carry a query or a fragment")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not url.lower().startswith(scheme + "://"):
        raise EndpointError("must be an http:// or https:// URL")
    if "@" in parts.netloc:
        raise EndpointError("must not carry user info (user@host)")
    try:
        port = parts.port
    except ValueError:
        raise EndpointError("has a port that is not a number from 1 to 65535") from None
    if port == 0:
        raise EndpointError("has a port that is not a number from 1 to 65535")
    host = _host(parts.netloc, parts.hostname or "")
    return Endpoint(scheme, host, port or _DEFAULT_PORTS[scheme], _path(parts.path))


def _host(netloc: str, hostname: str) -> str:
    if netloc.startswith("["):
        try:
            return ipaddress.IPv6Address(hostname).compressed
        except ValueError:
            raise EndpointError("has a bracketed host that is not an IPv6 address") from None
    host = hostname.removesuffix(".")
    if not _HOST.match(host):
        raise EndpointError("must name a host")
    if host.rsplit(".", 1)[-1].isdigit():
        # Numeric hosts only as a plain dotted IPv4 address: 0x7f.1, 2130706433 and 0177.0.0.1
        # reach hosts a name comparison would not see.
        try:
            return ipaddress.IPv4Address(host).compressed
        except ValueError:
            raise EndpointError("has a numeric host that is not a dotted IPv4 address") from None
    return host


def _path(path: str) -> str:
    path = path.rstrip("/")
    segments = path.split("/")[1:]
    if any(segment in ("", ".", "..") for segment in segments):
        raise EndpointError("must not have empty, '.' or '..' path segments")
    return path


def endpoints(urls: Sequence[str]) -> tuple[Endpoint, ...]:
    """The operator's endpoints; ValueError naming the one that cannot be used."""
    found = []
    for url in urls:
        try:
            found.append(parse(url))
        except EndpointError as exc:
            raise ValueError(f"--model-endpoint {url!r} {exc}") from None
    return tuple(found)


def key_envs(names: Sequence[str]) -> frozenset[str]:
    for name in names:
        if not _ENV_NAME.match(name):
            raise ValueError(f"--model-key-env {name!r} is not the name of an environment variable")
    return frozenset(names)


@dataclass(frozen=True)
class Verdict:
    # None when allowed; else the refused field and why.
    field: str | None
    problem: str = ""
    # The URL the client is given: the normalised one whenever endpoints are restricted.
    url: str = ""


@dataclass
class ModelEgress:
    """What the operator allows. ``required`` (server mode): with a list empty, nothing of
    it is allowed; otherwise (local mode) an empty list restricts nothing."""

    endpoints: tuple[Endpoint, ...] = ()
    key_envs: frozenset[str] = frozenset()
    required: bool = False
    _verdicts: Recent[tuple[str, str], Verdict] = field(
        default_factory=lambda: Recent(_VERDICTS), repr=False, compare=False
    )

    @classmethod
    def configured(cls, urls: Sequence[str], names: Sequence[str], *, required: bool) -> ModelEgress:
        return cls(endpoints(urls), key_envs(names), required)

    def verdict(self, base_url: str, api_key_env: str) -> Verdict:
        """Whether an actor with this URL and key variable may be used (kept per pair)."""
        key = (base_url, api_key_env)
        found = self._verdicts.get(key)
        if found is None:
            found = self._judge(base_url, api_key_env)
            self._verdicts.put(key, found)
        return found

    def _judge(self, base_url: str, api_key_env: str) -> Verdict:
        url = base_url
        if base_url and (self.required or self.endpoints):
            try:
                endpoint = parse(base_url)
            except EndpointError as exc:
                return Verdict("spec.base_url", str(exc))
            if not any(allowed.covers(endpoint) for allowed in self.endpoints):
                return Verdict("spec.base_url", ENDPOINT_REFUSED)
            url = endpoint.url()
        if api_key_env and (self.required or self.key_envs) and api_key_env not in self.key_envs:
            return Verdict("spec.api_key_env", KEY_ENV_REFUSED)
        return Verdict(None, url=url)
