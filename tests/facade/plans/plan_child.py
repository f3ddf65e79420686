"""A server process for the plan crash tests, killed with SIGKILL mid-way.

``apply DB FOLDER``: set up a project over FOLDER, run a plan, print its id, then apply
it (the test sets ACP_TEST_APPLY_PAUSE_FILE so apply waits between files).
``running DB FOLDER PID_FILE``: start a plan whose command step sleeps, print its id once
it is executing, then wait to be killed.
``gated DB FOLDER PID_FILE GATE``: the same, with a step that ends once GATE exists
(test_lease_processes.py freezes this process past its lease, then wakes it). With
``$FREEZE_ENV`` set (PostgreSQL), the process stops itself (SIGSTOP) inside the first lease
renewal made once the step's command runs: the renewal's UPDATE done, its transaction open,
so its connection sits idle in transaction holding the lease row's lock.
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import sys
import threading
from collections.abc import Mapping

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.store.postgres import PostgresStore
from cleveragents.acp.v1 import plan_pb2
from tests.facade.plans.helpers import (
    INPUTS,
    PY,
    add_action,
    add_command_tool,
    add_profile,
    add_project,
    eventually,
    run,
    status,
    use,
)

# A step that ends once the file named by its second argument exists.
GATED = (
    "import os, sys, time\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "deadline = time.monotonic() + 60\n"
    "while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:\n"
    "    time.sleep(0.02)\n"
)
# A step with a child of its own (one process group): both pids written once both run.
FAMILY = (
    "import os, subprocess, sys, time; child = subprocess.Popen(['sleep', '600']);"
    "open(sys.argv[1] + '.tmp', 'w').write(f'{os.getpid()} {child.pid}');"
    "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(600)"
)
FREEZE_ENV = "PLAN_CHILD_FREEZE_IN_RENEWAL"
SLOW = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def freeze_in_renewal(pid_file: str) -> None:
    original = PostgresStore.renew_leases

    def renew(self: PostgresStore, owner: str, tokens: Mapping[str, int], ttl: float) -> dict[str, str]:
        renewed = original(self, owner, tokens, ttl)
        if os.path.exists(pid_file) and pathlib.Path(pid_file).read_text():
            PostgresStore.renew_leases = original  # type: ignore[method-assign]
            # Directed at this thread: it stops before it runs another line (one sent to the
            # process may be taken by another thread, and this one commit meanwhile).
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        return renewed

    PostgresStore.renew_leases = renew  # type: ignore[method-assign, assignment]


async def main(mode: str, db: str, folder: str, *rest: str) -> None:
    if os.environ.get(FREEZE_ENV):
        freeze_in_renewal(rest[0])
    client = ACPClient(LocalTransport(open_facade(db), owns_facade=True))
    await add_project(client, pathlib.Path(folder))
    if mode == "apply":
        await add_action(client)
        plan = await run(client, (await use(client, INPUTS)).meta.id)
        say(plan.meta.id)
        await client.call("plan.apply", plan_id=plan.meta.id)
        say("applied")
    else:
        if mode == "gated":
            await add_command_tool(client, "slow", [PY, "-c", GATED, "{{pid_file}}", "{{gate}}"])
            args = {"pid_file": rest[0], "gate": rest[1]}
        else:
            await add_command_tool(client, "slow", [PY, "-c", SLOW, "{{pid_file}}"])
            args = {"pid_file": rest[0]}
        await add_profile(client, "slow", allowed_tools=["slow"])
        await add_action(client, steps=[{"tool": "slow", "args": args}], profile="slow")
        plan = await use(client, {})
        await client.call("plan.execute", plan_id=plan.meta.id)

        async def executing() -> bool:
            phase = (await status(client, plan.meta.id)).phase
            return phase == plan_pb2.PLAN_PHASE_EXECUTE

        await eventually(executing)
        say(plan.meta.id)
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
