"""FastAPI dependencies for routes users add to the gateway."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends
from starlette.requests import Request

from cleveragents.acp.contract.acp_client import ACPClient
from cleveragents.acp.contract.transport import ServiceTransport
from cleveragents.acp.gateway import common
from cleveragents.acp.gateway.http import binding


def caller_client(request: Request) -> ACPClient:
    """An ``ACPClient`` that calls ACP as the request's caller: its bearer token and
    ``ACP-Version`` header, over the gateway's own service (the seam both servers call).
    Authentication and every other check happen below, as for any ACP call; two
    Authorization headers are AMBIGUOUS_CREDENTIALS, as on the hot paths. Nothing to
    close: the service is the gateway's."""
    gateway = request.app.state.gateway
    return ACPClient(
        ServiceTransport(gateway.service),
        acp_version=binding.header(request, b"acp-version") or None,
        token=common.single_bearer(binding.header_values(request, b"authorization")),
    )


# ``async def route(acp: CallerClient) -> ...``
CallerClient = Annotated[ACPClient, Depends(caller_client)]
