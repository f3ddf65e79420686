"""``agents editor`` driven by acpx (npm; ``--format json`` prints the JSON-RPC transcript),
a Zed ACP client nobody here wrote: the README tour's plan from ``/hello name=Ada`` with
``--approve-all`` (the file written) and ``--deny-all`` (staged), both answering the server's
approval request of the apply, and a second acpx process
continuing the session with ``session/load``. ``make test`` installs acpx (.build/acpx)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
from typing import Any

import pytest

from tests.client.cli.conftest import Cli, make_cli
from tests.client.cli.test_editor import tour
from tests.facade.plans.model_world import KEY, KEY_ENV
from tests.fake_openai import FakeOpenAI, turn
from tests.needs import ROOT, unavailable
from tests.server_process import ServerProcess, Tokens, agents_command

ACPX = pathlib.Path(os.environ.get("ACP_ACPX", ROOT / ".build" / "acpx" / "node_modules" / ".bin" / "acpx"))


def _command(cli: Cli, args: tuple[str, ...], agent: list[str] | None) -> tuple[list[str], dict[str, str]]:
    if shutil.which("node") is None or not ACPX.exists():
        unavailable(f"acpx and Node (make test installs acpx at {ACPX})")
    env = {**cli.env, "HOME": str(cli.cwd / "home"), "PYTHONPATH": str(ROOT)}
    command = " ".join(agent or agents_command("editor"))
    # --ttl 1: the queue owner acpx keeps for a session (and its bridge) exits a second after its last prompt.
    return [str(ACPX), "--agent", command, "--format", "json", "--timeout", "90", "--ttl", "1", *args], env


def acpx_process(
    cli: Cli, site: pathlib.Path, *args: str, agent: list[str] | None = None
) -> subprocess.Popen[str]:
    command, env = _command(cli, args, agent)
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=site
    )


def acpx(
    cli: Cli, site: pathlib.Path, *args: str, expect: int = 0, agent: list[str] | None = None
) -> list[dict[str, Any]]:
    command, env = _command(cli, args, agent)
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=site, timeout=150)
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
    # The answer went to the server's approval request (approval.answer), asked before the apply.
    approvals = json.loads(local_cli("approval", "list", "--json").out)["approvals"]
    assert [(a["kind"], a["answer"], a["answered_by"]) for a in approvals] == [
        (
            "apply",
            "APPROVAL_ANSWER_ALLOW_ONCE" if policy == "--approve-all" else "APPROVAL_ANSWER_REJECT_ONCE",
            "local",
        )
    ], approvals
    assert approvals[0]["digest"].startswith("sha256:")
    assert approvals[0]["reason"] == "answered in the editor (Zed ACP session/request_permission)"
    if policy == "--approve-all":
        assert (site / "hello.txt").read_text() == "Hello, Ada!\n"
    else:
        assert not (site / "hello.txt").exists()
        plans = json.loads(local_cli("plan", "list", "--json").out)["plans"]
        assert [(p["phase"], p["state"]) for p in plans] == [("PLAN_PHASE_EXECUTE", "PLAN_STATE_SUCCEEDED")]


def test_a_second_acpx_process_continues_the_session(local_cli: Cli) -> None:
    site = tour(local_cli)
    acpx(local_cli, site, "sessions", "new")
    transcript = acpx(local_cli, site, "prompt", "/actions")
    assert methods(transcript)[:3] == ["initialize", "session/load", "session/prompt"], methods(transcript)
    session_id = next(m["params"]["sessionId"] for m in transcript if m.get("method") == "session/load")
    shown = json.loads(local_cli("session", "show", session_id, "--json").out)
    assert shown["messages"][0]["content"] == "/actions"
    assert shown["session"]["labels"] == {"client": "zed-acp"}


def test_acpx_cancel_ends_a_streaming_model_turn_cancelled(local_cli: Cli) -> None:
    """A model orchestrator streams slowly (the fake OpenAI server); ``acpx cancel`` from
    another process ends the prompt with ``cancelled`` and the turn is stored cancelled."""
    site = tour(local_cli)
    fake = FakeOpenAI().start_in_thread()
    try:
        fake.repeat = turn("word " * 200, pieces=200, delay=0.1)
        local_cli.env[KEY_ENV] = KEY
        actor = {
            "provider": "openai",
            "model": "fake-model",
            "base_url": fake.base_url,
            "api_key_env": KEY_ENV,
        }
        local_cli("actor", "add", "model", "--spec", json.dumps(actor))
        agent = [*agents_command("editor"), "--orchestrator", "model"]
        acpx(local_cli, site, "sessions", "new", agent=agent)
        with acpx_process(local_cli, site, "prompt", "tell me a long story", agent=agent) as prompt:
            try:
                assert prompt.stdout is not None
                for line in prompt.stdout:
                    if '"agent_message_chunk"' in line:
                        break
                acpx(local_cli, site, "cancel", agent=agent)
                rest = prompt.stdout.read()
                prompt.wait(timeout=60)
            finally:
                if prompt.poll() is None:
                    prompt.kill()
        assert '"stopReason":"cancelled"' in rest, rest
    finally:
        fake.stop_thread()
    sessions = json.loads(local_cli("session", "list", "--json").out)["sessions"]
    shown = json.loads(local_cli("session", "show", sessions[0]["meta"]["id"], "--json").out)
    assert [t["state"] for t in shown["turns"]] == ["TURN_STATE_CANCELLED"], shown


def test_acpx_runs_the_tour_against_a_server(
    cli_server: tuple[ServerProcess, Tokens], tmp_path: pathlib.Path
) -> None:
    """The same through ``agents serve`` (HTTP, a token): the file written once allowed."""
    cli = make_cli("http", tmp_path, cli_server)
    site = tour(cli)
    transcript = acpx(cli, site, "--approve-all", "exec", "/hello name=Ada")
    assert {"session/new", "session/prompt", "session/request_permission"} <= set(methods(transcript))
    assert (site / "hello.txt").read_text() == "Hello, Ada!\n"
