"""Command tools and command validations run while gRPC is busy in the same process.

Started with ``fork()`` (a ``preexec_fn``, or subprocess's ``user``/``group`` arguments),
a command's child ran gRPC's fork handlers, and with gRPC's threads at work it died of
SIGABRT or SIGSEGV before its exec: about one command in a hundred in a real ``agents serve
--allow-commands`` answering gRPC calls, one in four beside an in-process gRPC client. The
runner now starts a wrapper that contains the command and runs no fork handler (process.py).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import pwd

import grpc
import pytest

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.grpc_transport import GrpcTransport
from cleveragents.acp.facade.domain.access.policy import CommandUser, Policy
from cleveragents.acp.facade.domain.plans import process
from cleveragents.acp.v1 import plan_pb2
from tests.facade.plans.helpers import add_action, add_command_tool, add_profile, run, use, write_tree
from tests.server_process import Children, Tokens, start_server

# The served test: plans of STEPS command steps and one command validation, AT_ONCE at a
# time, while POLLERS calls over CHANNELS connections keep the server's gRPC threads busy.
PLANS = 40
STEPS = 10
AT_ONCE = 4
POLLERS = 16
CHANNELS = 8
# The in-process test: commands run one after another beside a busy gRPC client and server
# (with the fork() start, 35-45% of them died: 53-68 of 150 in four runs).
COMMANDS = 80
PINGERS = 4


def _command_user() -> CommandUser | None:
    if os.geteuid() != 0:
        return None
    account = pwd.getpwnam("nobody")
    return CommandUser("nobody", account.pw_uid, account.pw_gid)


async def _poll(client: ACPClient, done: asyncio.Event) -> int:
    calls = 0
    while not done.is_set():
        await client.call("plan.list")
        calls += 1
    return calls


async def test_commands_of_plans_run_every_time_while_a_server_answers_grpc(
    tmp_path: pathlib.Path, children: Children
) -> None:
    tokens = Tokens.create(tmp_path)
    user = ["--command-user", "nobody"] if os.geteuid() == 0 else []
    server = children.server(start_server(tmp_path, "--allow-commands", *user, tokens=tokens.path))
    project = tmp_path / "repo"
    write_tree(project, {"README.md": b"# Demo\n"})
    clients = [
        ACPClient(GrpcTransport.connect(server.grpc_target, timeout=60), token=tokens.tokens["alice"])
        for _ in range(CHANNELS)
    ]
    client = clients[0]
    try:
        await client.call("resource.add", name="repo", spec={"type": "directory", "path": str(project)})
        await client.call("project.add", name="proj", spec={"resources": ["repo"]})
        await add_command_tool(client, "noop", ["true"])
        await client.call("validation.add", name="check", spec={"command": {"argv": ["true"]}})
        await add_profile(client, "cmds", allowed_tools=["noop"], allowed_validations=["check"])
        steps = [{"id": f"noop{index}", "tool": "noop", "args": {}} for index in range(STEPS)]
        await add_action(client, steps=steps, validations=["check"], profile="cmds")
        gate = asyncio.Semaphore(AT_ONCE)

        async def one() -> plan_pb2.Plan:
            async with gate:
                return await run(client, (await use(client, {})).meta.id)

        done = asyncio.Event()
        pollers = [asyncio.ensure_future(_poll(clients[i % CHANNELS], done)) for i in range(POLLERS)]
        try:
            plans = await asyncio.gather(*(one() for _ in range(PLANS)))
        finally:
            done.set()
            polled = await asyncio.gather(*pollers)
        failed = [
            f"{plan.meta.id}: {plan.last_error.code} {plan.last_error.message}"
            for plan in plans
            if plan.state != plan_pb2.PLAN_STATE_SUCCEEDED
        ]
        assert not failed, f"{len(failed)} of {PLANS} plans failed:\n" + "\n".join(failed)
        assert all(polled), polled
    finally:
        for made in clients:
            await made.close()
    assert server.stop() == 0, server.stderr()


@pytest.mark.parametrize("as_user", [False, True], ids=["server-user", "command-user"])
async def test_commands_start_every_time_beside_busy_grpc_threads(
    tmp_path: pathlib.Path, as_user: bool
) -> None:
    user = _command_user() if as_user else None
    if as_user and user is None:
        pytest.skip("switching users needs root")
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    done = asyncio.Event()

    async def ping() -> None:
        # An unknown method: each call crosses the client's and the server's gRPC threads.
        method = channel.unary_unary("/acp.test.Nothing/Ping", None, None)
        while not done.is_set():
            with pytest.raises(grpc.aio.AioRpcError):
                await method(b"", timeout=30)

    pingers = [asyncio.ensure_future(ping()) for _ in range(PINGERS)]
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    failed: list[process.ProcessResult] = []
    try:
        for _ in range(COMMANDS):
            result = await process.run(
                ["true"],
                scratch,
                seconds=60,
                output_limit=4096,
                cancel=asyncio.Event(),
                policy=Policy(command_user=user),
            )
            if not result.ok:
                failed.append(result)
    finally:
        done.set()
        await asyncio.gather(*pingers)
        await channel.close(None)
        await server.stop(None)
    assert not failed, f"{len(failed)} of {COMMANDS} commands failed, the first: {failed[0]}"
