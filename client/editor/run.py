"""Runs the bridge on stdin and stdout until the client closes stdin."""

from __future__ import annotations

import asyncio

from acp import AgentSideConnection

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.editor.agent import EditorAgent
from cleveragents.acp.client.editor.stdio import JsonRpcLines, open_writer

# How long the bridge waits, once stdin ends, for the work in flight to make progress.
SETTLE_SECONDS = 30.0
REQUEST_TASK = "acp.Connection.request"


async def serve(client: ACPClient, where: str, rpc_fd: int, *, orchestrator: str = "") -> int:
    """Serve one client on stdin and the descriptor ``rpc_fd`` (the real stdout, claimed
    with ``stdio.claim_stdout`` before anything could write to it)."""
    writer = await open_writer(rpc_fd)
    lines = JsonRpcLines(writer)
    agent = EditorAgent(client, where, orchestrator=orchestrator)
    connection = AgentSideConnection(agent, writer, lines.reader, listening=False)
    lines.start()
    try:
        await connection.listen()
        # stdin ended: the requests already read are still answered (and, in local mode, the
        # work they started in this process finishes) before the connection closes.
        await _settle()
    finally:
        await agent.close()
        await connection.close()
        await client.close()
    return 0


async def _settle() -> None:
    current = asyncio.current_task()
    # The SDK names the task of each request it serves (acp/connection.py).
    while pending := [
        t for t in asyncio.all_tasks() if t is not current and not t.done() and t.get_name() == REQUEST_TASK
    ]:
        done, _ = await asyncio.wait(pending, timeout=SETTLE_SECONDS)
        if not done:
            return
