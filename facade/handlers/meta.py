"""meta.version: what this server speaks."""

from __future__ import annotations

import functools
from importlib import metadata

from cleveragents.acp.contract import catalog, versions
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
        """Every version the server speaks, newest major first (ACP 2.0, 1.2, 1.1 where both
        majors are served); the current one is that of the major the request speaks."""
        served = catalog.CATALOG.majors
        table = served.get(versions.major_of(ctx.served_version), catalog.CATALOG.default).version_table
        return meta_pb2.GetVersionResponse(
            supported_versions=catalog.CATALOG.served_versions(),
            current_version=table.current,
            server_build=server_build(),
        )
