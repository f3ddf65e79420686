"""meta.version: what this server speaks."""

from __future__ import annotations

import functools
from importlib import metadata

from cleveragents.acp.contract import versions
from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.facade.handlers.table import handles
from cleveragents.acp.v1 import meta_pb2


@functools.cache
def server_build() -> str:
    """Read once: importlib.metadata searches every path entry (about 0.2 ms a call)."""
    try:
        return f"cleveragents-acp {metadata.version('cleveragents-acp')}"
    except metadata.PackageNotFoundError:
        return "cleveragents-acp (not installed)"


class MetaHandlers:
    @handles("meta.version")
    async def GetVersion(
        self, request: meta_pb2.GetVersionRequest, ctx: CallContext
    ) -> meta_pb2.GetVersionResponse:
        return meta_pb2.GetVersionResponse(
            supported_versions=list(versions.SUPPORTED),
            current_version=versions.CURRENT,
            server_build=server_build(),
        )
