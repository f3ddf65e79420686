"""``agents editor`` driven by acpx (npm; ``--format json`` prints the JSON-RPC transcript),
a Zed ACP client nobody here wrote: the README tour's plan from ``/hello name=Ada`` with
``--approve-all`` (the file written) and ``--deny-all`` (staged), and a second acpx process
continuing the session with ``session/load``. ``make test`` installs acpx (.build/acpx)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
from typing import Any

import pytest

from tests.client.cli.conftest import Cli
from tests.client.cli.test_editor import tour
from tests.needs import ROOT, unavailable
from tests.server_process import agents_command

ACPX = pathlib.Path(os.environ.get("ACP_ACPX", ROOT / ".build" / "acpx" / "node_modules" / ".bin" / "acpx"))


def acpx(cli: Cli, site: pathlib.Path, *args: str, expect: int = 0) -> list[dict[str, Any]]:
    if shutil.which("node") is None or not ACPX.exists():
        unavailable(f"acpx and Node (make test installs acpx at {ACPX})")
    env = {**cli.env, "HOME": str(cli.cwd / "home"), "PYTHONPATH": str(ROOT)}
    agent = " ".join(agents_command("editor"))
    done = subprocess.run(
        [str(ACPX), "--agent", agent, "--format", "json", "--timeout", "90", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=site,
        timeout=150,
    )
    assert done.returncode == expect, f"{done.stdout}\n{done.stderr}"
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"jsonrpc"')]


def methods(transcript: list[dict[str, Any]]) -> list[str]:
    return [m["method"] for m in transcript if "method" in m]


def updates(transcript: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    found = [m["params"]["update"] for m in transcript if m.get("method") == "session/update"]
    return [u for u in found if u["sessionUpdate"] == kind]


@pytest.mark.parametrize("policy", ["--approve-all", "--deny-all"])
def test_acpx_runs_the_tour_plan_to_a_written_file_or_leaves_it_staged(local_cli: Cli, policy: str) -> None:
    site = tour(local_cli)
    # acpx exits 5 when it denied a permission request.
    transcript = acpx(
        local_cli, site, policy, "exec", "/hello name=Ada", expect=5 if policy == "--deny-all" else 0
    )
    assert {"initialize", "session/new", "session/prompt", "session/request_permission"} <= set(
        methods(transcript)
    )
    assert "edit" in {c.get("kind") for c in updates(transcript, "tool_call")}
    asked = next(m for m in transcript if m.get("method") == "session/request_permission")
    diff = asked["params"]["toolCall"]["content"][0]
    assert (diff["type"], diff["path"], diff["newText"]) == ("diff", str(site / "hello.txt"), "Hello, Ada!\n")
    ended = [m["result"] for m in transcript if "stopReason" in m.get("result", {})]
    assert ended == [{"stopReason": "end_turn"}], transcript
    if policy == "--approve-all":
        assert (site / "hello.txt").read_text() == "Hello, Ada!\n"
    else:
        assert not (site / "hello.txt").exists()
        plans = json.loads(local_cli("plan", "list", "--json").out)["plans"]
        assert [(p["phase"], p["state"]) for p in plans] == [("PLAN_PHASE_EXECUTE", "PLAN_STATE_SUCCEEDED")]


def test_a_second_acpx_process_continues_the_session(local_cli: Cli) -> None:
    site = tour(local_cli)
    acpx(local_cli, site, "sessions", "new")
    transcript = acpx(local_cli, site, "--ttl", "1", "prompt", "/actions")
    assert methods(transcript)[:3] == ["initialize", "session/load", "session/prompt"], methods(transcript)
    session_id = next(m["params"]["sessionId"] for m in transcript if m.get("method") == "session/load")
    shown = json.loads(local_cli("session", "show", session_id, "--json").out)
    assert shown["messages"][0]["content"] == "/actions"
    assert shown["session"]["labels"] == {"client": "zed-acp"}
