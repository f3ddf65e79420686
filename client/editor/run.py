"""Runs the bridge on stdin and stdout until the client closes stdin."""

from __future__ import annotations

from acp import AgentSideConnection

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.editor.agent import EditorAgent
from cleveragents.acp.client.editor.stdio import JsonRpcLines, open_writer


async def serve(client: ACPClient, where: str, rpc_fd: int) -> int:
    """Serve one client on stdin and the descriptor ``rpc_fd`` (the real stdout, claimed
    with ``stdio.claim_stdout`` before anything could write to it)."""
    writer = await open_writer(rpc_fd)
    lines = JsonRpcLines(writer)
    agent = EditorAgent(client, where)
    connection = AgentSideConnection(agent, writer, lines.reader, listening=False)
    lines.start()
    try:
        await connection.listen()
    finally:
        await agent.close()
        await connection.close()
        await client.close()
    return 0
