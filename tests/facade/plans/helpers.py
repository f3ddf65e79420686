"""Building projects and actions for plan tests through the registry operations."""

from __future__ import annotations

import asyncio
import pathlib
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from cleveragents.acp.client.acp_client import ACPClient
from cleveragents.acp.v1 import events_pb2, plan_pb2

PY = sys.executable

ORIGINAL = {
    "README.md": b"# Demo\n\nHello.\n",
    "src/app.py": b"def main():\n    return 'old'\n",
    "obsolete.txt": b"remove me\n",
    "data/blob.bin": bytes(range(256)),
}

# Create one file, modify one, delete one.
STEPS: list[dict[str, Any]] = [
    {"id": "create", "tool": "fs.write", "args": {"path": "docs/{{name}}.md", "content": "# {{title}}\n"}},
    {
        "id": "modify",
        "tool": "fs.replace",
        "args": {"path": "src/app.py", "old": "'old'", "new": "'{{word}}'"},
    },
    {"id": "delete", "tool": "fs.delete", "args": {"path": "obsolete.txt"}},
]
INPUTS = {"name": "guide", "title": "The guide", "word": "new"}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "title": {"type": "string"}, "word": {"type": "string"}},
    "required": ["name", "word"],
}


def write_tree(root: pathlib.Path, files: Mapping[str, bytes] = ORIGINAL) -> None:
    for path, content in files.items():
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)


def snapshot(root: pathlib.Path) -> dict[str, Any]:
    """Every file's bytes and mode, and every folder: what "byte-identical" compares."""
    found: dict[str, Any] = {}
    for entry in sorted(root.rglob("*")):
        key = entry.relative_to(root).as_posix()
        found[key] = (entry.read_bytes(), entry.stat().st_mode) if entry.is_file() else "dir"
    return found


async def add_project(
    client: ACPClient,
    folder: pathlib.Path,
    *,
    name: str = "proj",
    resource: str = "repo",
    namespace: str = "",
) -> None:
    await client.call(
        "resource.add", namespace=namespace, name=resource, spec={"type": "directory", "path": str(folder)}
    )
    await client.call("project.add", namespace=namespace, name=name, spec={"resources": [resource]})


async def add_action(
    client: ACPClient,
    *,
    name: str = "act",
    steps: Sequence[Mapping[str, Any]] = STEPS,
    schema: Mapping[str, Any] | None = None,
    validations: Sequence[str] = (),
    invariants: Sequence[str] = (),
    profile: str = "",
    prompt: str = "Carry out the action.",
    namespace: str = "",
    actor: str = "scripted",
) -> None:
    spec: dict[str, Any] = {
        "actor": actor,
        "prompt_template": prompt,
        "steps": list(steps),
        "validations": list(validations),
        "invariants": list(invariants),
        "automation_profile": profile,
    }
    if schema is not None:
        spec["inputs_schema"] = dict(schema)
    await client.call("action.add", namespace=namespace, name=name, spec=spec)


async def add_profile(client: ACPClient, name: str, **spec: Any) -> None:
    await client.call("automation_profile.add", name=name, spec=spec)


async def add_command_tool(client: ACPClient, name: str, argv: Sequence[str], **spec: Any) -> None:
    await client.call("tool.add", name=name, spec={"argv": list(argv), **spec})


async def use(client: ACPClient, inputs: Mapping[str, Any] = INPUTS, **fields: Any) -> plan_pb2.Plan:
    response = await client.call(
        "plan.use", {"action": "act", "project": "proj", "inputs": dict(inputs), **fields}
    )
    assert isinstance(response, plan_pb2.UsePlanResponse)
    return response.plan


async def run(client: ACPClient, plan_id: str) -> plan_pb2.Plan:
    response = await client.call("plan.execute", plan_id=plan_id, wait=True)
    assert isinstance(response, plan_pb2.ExecutePlanResponse)
    return response.plan


async def status(client: ACPClient, plan_id: str) -> plan_pb2.Plan:
    response = await client.call("plan.status", plan_id=plan_id)
    assert isinstance(response, plan_pb2.GetPlanStatusResponse)
    return response.plan


async def wait_for(client: ACPClient, plan_id: str, state: int, *, seconds: float = 10) -> plan_pb2.Plan:
    async with asyncio.timeout(seconds):
        while True:
            plan = await status(client, plan_id)
            if plan.state == state:
                return plan
            await asyncio.sleep(0.02)


async def eventually(check: Callable[[], Awaitable[bool]], *, seconds: float = 10) -> None:
    async with asyncio.timeout(seconds):
        while True:
            if await check():
                return
            await asyncio.sleep(0.02)


async def plan_events(client: ACPClient, plan_id: str) -> list[events_pb2.Event]:
    """Every retained event of a plan, read until the stream goes quiet."""
    found: list[events_pb2.Event] = []
    stream = aiter(client.subscribe(plan_id=plan_id))
    try:
        while True:
            try:
                found.append(await asyncio.wait_for(anext(stream), 0.3))
            except TimeoutError:
                return found
    finally:
        if isinstance(stream, AsyncGenerator):
            await stream.aclose()


def gone(pid: int) -> bool:
    """No such process, or a zombie (dead, waiting for a parent to reap it)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")
