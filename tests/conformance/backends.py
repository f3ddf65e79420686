"""The three transports over fresh, real backends: a facade over a real SQLite file, served
in process by the real ``Server`` (uvicorn + the FastAPI gateway, grpc.aio) on ephemeral
loopback ports, with token auth on.

Every backend authenticates with the same token file, the local one included, so auth
errors are part of what the transports are compared on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import pathlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.client.http_transport import HTTPTransport
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.transport import Transport
from cleveragents.acp.facade.auth import TokenAuthenticator
from cleveragents.acp.facade.domain.access.policy import Policy
from cleveragents.acp.facade.domain.access.webhook_egress import WebhookEgress
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.gateway.http.endpoint import GatewaySettings
from cleveragents.acp.gateway.server import Server, ServerConfig
from tests.conformance import logged
from tests.conformance.envelopes import EnvelopeChecker
from tests.conformance.rest import RESTTransport
from tests.conformance.times import now
from tests.server_process import Tokens

# http: the envelope endpoint; rest: the REST routes; gateway: the envelope through a
# gateway-only server (`agents gateway`) whose upstream is the backend's gRPC server.
KINDS = ("local", "http", "grpc", "rest", "gateway")
TIMEOUT = 15.0


@dataclass
class Backend:
    kind: str
    # Scratch space for this backend's project folders.
    root: pathlib.Path
    tokens: Tokens
    transport: Transport
    http_url: str = ""
    grpc_target: str = ""
    envelopes: EnvelopeChecker = field(default_factory=EnvelopeChecker)
    # When the backend was opened: every time it answers is at or after it.
    opened: datetime.datetime = field(default_factory=now)

    def token(self, principal: str | None) -> str | None:
        """A principal's token; ``None`` for none; any other string is sent as it is."""
        if principal is None:
            return None
        return self.tokens.tokens.get(principal, principal)

    def client(self, principal: str | None = "alice", *, acp_version: str | None = None) -> ACPClient:
        return ACPClient(self.transport, token=self.token(principal), acp_version=acp_version)

    def http_client(self, **kwargs: object) -> httpx.AsyncClient:
        """A raw HTTP client whose every answer is checked for envelope conformance."""
        return httpx.AsyncClient(
            base_url=self.http_url,
            timeout=TIMEOUT,
            event_hooks={"response": [self.envelopes.hook]},
            **kwargs,  # type: ignore[arg-type]
        )


def policy() -> Policy:
    """The local policy, letting webhooks name a loopback receiver (``WEBHOOK_URL``: none
    listens; backends deliver nothing, and webhook.test answers the refused connection)."""
    local = Policy.local()
    local.webhooks = WebhookEgress.configured(allow_http=True, allow_networks=["127.0.0.1/32"])
    return local


def scratch(directory: pathlib.Path) -> pathlib.Path:
    root = directory / "files"
    root.mkdir(parents=True, exist_ok=True)
    return root


@contextlib.asynccontextmanager
async def open_backend(
    kind: str,
    directory: pathlib.Path,
    tokens: Tokens,
    *,
    keepalive_seconds: float = 15.0,
    max_body_bytes: int = GatewaySettings.max_body_bytes,
) -> AsyncIterator[Backend]:
    """A fresh backend in ``directory`` reached over ``kind``; stopped cleanly on exit."""
    root = scratch(directory)
    opened = now()
    facade = open_facade(directory / "acp.db", authenticator=TokenAuthenticator(tokens.path), policy=policy())
    if kind == "local":
        transport: Transport = LocalTransport(facade)
        try:
            yield Backend(kind, root, tokens, transport, opened=opened)
        finally:
            await facade.close()
        return
    config = ServerConfig(
        host="127.0.0.1",
        http_port=0,
        grpc_port=0,
        http=GatewaySettings(keepalive_seconds=keepalive_seconds, max_body_bytes=max_body_bytes),
        grace_seconds=1.0,
    )
    server = Server(config, facade=facade, observability=logged.observability())
    addresses = await server.start()
    assert addresses.grpc_target is not None
    backend = Backend(
        kind, root, tokens, LocalTransport(facade), addresses.http_url, addresses.grpc_target, opened=opened
    )
    gateway: Server | None = None
    if kind == "http":
        backend.transport = HTTPTransport(backend.http_client(), owns_client=True)
    elif kind == "rest":
        backend.transport = RESTTransport(backend.http_client())
    elif kind == "grpc":
        backend.transport = GrpcTransport.connect(addresses.grpc_target, timeout=TIMEOUT)
    else:
        upstream = GrpcTransport.connect(addresses.grpc_target, timeout=TIMEOUT)
        gateway_config = dataclasses.replace(config, grpc_port=None)
        gateway = Server(gateway_config, upstream=upstream, observability=logged.observability())
        backend.http_url = (await gateway.start()).http_url
        backend.transport = HTTPTransport(backend.http_client(), owns_client=True)
    try:
        yield backend
    finally:
        await backend.transport.close()
        if gateway is not None:
            await gateway.stop()
        await server.stop()
