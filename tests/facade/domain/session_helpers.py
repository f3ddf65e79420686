"""Registry set-up shared by the session and context tests, all through the client."""

from __future__ import annotations

import os
import pathlib
from typing import Any

import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.v1 import session_pb2


async def add_folder(
    client: ACPClient, name: str, folder: pathlib.Path, *, namespace: str = "default"
) -> pathlib.Path:
    os.makedirs(folder, exist_ok=True)
    await client.call(
        "resource.add", namespace=namespace, name=name, spec={"type": "directory", "path": str(folder)}
    )
    return folder


async def add_project(
    client: ACPClient, name: str, folder: pathlib.Path, *, namespace: str = "default"
) -> pathlib.Path:
    """A project over one directory resource named ``<name>-src``."""
    await add_folder(client, f"{name}-src", folder, namespace=namespace)
    await client.call("project.add", namespace=namespace, name=name, spec={"resources": [f"{name}-src"]})
    return folder


async def create(client: ACPClient, **fields: Any) -> session_pb2.Session:
    response = await client.call("session.create", **fields)
    assert isinstance(response, session_pb2.CreateSessionResponse)
    return response.session


async def tell(client: ACPClient, session_id: str, content: str) -> session_pb2.TellSessionResponse:
    response = await client.call("session.tell", session_id=session_id, content=content)
    assert isinstance(response, session_pb2.TellSessionResponse)
    return response


async def error_of(client: ACPClient, operation: str, **fields: Any) -> ACPError:
    with pytest.raises(ACPError) as info:
        await client.call(operation, **fields)
    return info.value
