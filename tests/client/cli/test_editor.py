"""``agents editor`` driven by the Zed ACP Python SDK's client side (its ``spawn_agent_process``
and its example client from the sdist), in local mode and against the shared server over
HTTP and gRPC: the README tour's plan from a prompt, a second bridge continuing the session,
bad input, another namespace's session, and stdout carrying JSON-RPC alone."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import uuid
from typing import Any, cast

from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block
from acp.interfaces import Client
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    Implementation,
    RequestPermissionResponse,
)

from tests.client.cli.conftest import Cli, clean_env
from tests.needs import ROOT, unavailable
from tests.server_process import ServerProcess, Tokens, agents_command

HELLO = {
    "actor": "scripted",
    "steps": [
        {"id": "greet", "tool": "fs.write", "args": {"path": "hello.txt", "content": "Hello, {{name}}!\n"}}
    ],
}
SDK_EXAMPLES = pathlib.Path(
    os.environ.get("ACP_ZED_SDK_EXAMPLES", ROOT / ".build" / "zed-acp-sdk" / "examples")
)


def tour(cli: Cli) -> pathlib.Path:
    """The README's tour: a folder, a project on it, the action hello."""
    site = cli.cwd / "site"
    (site / "src").mkdir(parents=True)
    # Servers are shared by a module's tests: each test's names are its own.
    suffix = f"{cli.mode}-{uuid.uuid4().hex[:8]}"
    cli("resource", "add", f"site-{suffix}", "--spec", json.dumps({"type": "directory", "path": str(site)}))
    cli("project", "add", f"demo-{suffix}", "--spec", json.dumps({"resources": [f"site-{suffix}"]}))
    cli("action", "add", "hello", "--spec", json.dumps(HELLO), expect=None)
    return site


class Recorder:
    """A Zed ACP client that records every update and answers permission requests with
    ``allow`` (an option id), refuses them (None: the method is not supported) or fails
    (``"error"``: an internal error)."""

    def __init__(self, allow: str | None = "allow") -> None:
        self.updates: list[Any] = []
        self.asked: list[Any] = []
        self.allow = allow
        # With ``allow="wait"``: set by the test once it sent session/cancel.
        self.cancelled = asyncio.Event()
        self.asking = asyncio.Event()

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append(update)

    async def request_permission(
        self, options: list[Any], session_id: str, tool_call: Any, **kwargs: Any
    ) -> RequestPermissionResponse:
        self.asked.append(tool_call)
        if self.allow is None:
            raise RequestError.method_not_found("session/request_permission")
        if self.allow == "wait":
            self.asking.set()
            # As the spec asks of a client: after session/cancel, answer ``cancelled``.
            await self.cancelled.wait()
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        if self.allow == "error":
            raise RequestError.internal_error({"details": "the editor broke"})
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=self.allow))

    def kinds(self, name: str) -> list[Any]:
        return [u for u in self.updates if u.session_update == name]

    def on_connect(self, conn: Any) -> None:
        return None


async def _initialize(conn: Any) -> Any:
    return await conn.initialize(
        protocol_version=PROTOCOL_VERSION,
        client_capabilities=ClientCapabilities(),
        client_info=Implementation(name="test", title="test", version="0"),
    )


def _bridge_env(cli: Cli) -> dict[str, str]:
    return {**cli.env, "PYTHONPATH": str(ROOT)}


async def _flow(cli: Cli) -> None:
    site = tour(cli)
    env = _bridge_env(cli)
    first = Recorder()
    async with spawn_agent_process(cast(Client, first), *agents_command("editor"), env=env, cwd=site) as (
        conn,
        _,
    ):
        init = await _initialize(conn)
        assert init.agent_capabilities.load_session is True
        assert [m.id for m in init.auth_methods] == ["acp-token"]
        created = await conn.new_session(cwd=str(site / "src"), mcp_servers=[])
        assert created.modes is not None
        assert created.modes.current_mode_id == "ask"
        answer = await conn.prompt(session_id=created.session_id, prompt=[text_block("/hello name=Ada")])
        assert answer.stop_reason == "end_turn"
        await conn.set_session_mode(session_id=created.session_id, mode_id="stage")
    session_id = created.session_id
    profile = cli("session", "show", session_id, "--value", "session.automation_profile").out.strip()
    assert profile == "editor-stage"
    assert (site / "hello.txt").read_text() == "Hello, Ada!\n"
    calls = first.kinds("tool_call")
    assert [c.kind for c in calls] == ["edit", "edit"], calls
    # The step's diff comes with its tool call, or with the update that completes it.
    shown = [*first.kinds("tool_call"), *first.kinds("tool_call_update")]
    diffs = [c for u in shown for c in (u.content or []) if c.type == "diff"]
    assert diffs, first.updates
    assert (diffs[0].path, diffs[0].new_text) == (str(site / "hello.txt"), "Hello, Ada!\n")
    assert first.asked, first.updates
    assert first.asked[0].content[0].new_text == "Hello, Ada!\n"
    assert first.kinds("plan")
    # A second bridge (another editor) continues the same session.
    second = Recorder(allow=None)
    async with spawn_agent_process(cast(Client, second), *agents_command("editor"), env=env, cwd=site) as (
        conn,
        _,
    ):
        await _initialize(conn)
        listed = await conn.list_sessions(cwd=str(site))
        assert session_id in [s.session_id for s in listed.sessions]
        loaded = await conn.load_session(cwd=str(site), session_id=session_id, mcp_servers=[])
        assert loaded is not None
        assert loaded.modes is not None
        assert loaded.modes.current_mode_id == "stage"
        replayed = [u.content.text for u in second.kinds("user_message_chunk")]
        assert replayed == ["/use hello name=Ada\n"], second.updates
        assert [c.kind for c in second.kinds("tool_call")] == ["edit"], second.updates
        answer = await conn.prompt(session_id=session_id, prompt=[text_block("/help")])
        assert answer.stop_reason == "end_turn"
        assert any("/actions" in u.content.text for u in second.kinds("agent_message_chunk"))
    shown = json.loads(cli("session", "show", session_id, "--json").out)
    assert [m["content"] for m in shown["messages"] if m["role"] == "MESSAGE_ROLE_USER"] == [
        "/use hello name=Ada",
        "/help",
    ]


def test_a_prompt_runs_the_tour_and_a_second_bridge_continues_the_session(cli: Cli) -> None:
    asyncio.run(_flow(cli))


def test_the_sdk_example_client_gets_answers_and_its_refusal_leaves_approval_pending(local_cli: Cli) -> None:
    example = SDK_EXAMPLES / "client.py"
    if not example.exists():
        unavailable(f"the Zed ACP SDK's example client (make setup puts it at {example})")
    site = tour(local_cli)
    done = subprocess.run(
        [sys.executable, str(example), *agents_command("editor")],
        input="/help\n/hello name=Ada\n",
        capture_output=True,
        text=True,
        env=_bridge_env(local_cli),
        cwd=site,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "| Agent: I am the built-in orchestrator" in done.stdout, done.stdout
    assert "(no answer was given)" in done.stdout, done.stdout
    assert not (site / "hello.txt").exists()
    _assert_pending(local_cli)


def _assert_pending(cli: Cli) -> None:
    """The plan's apply request was never answered (fail closed): pending, its plan waiting."""
    approvals = json.loads(cli("approval", "list", "--json").out)["approvals"]
    assert [(a["kind"], a["state"], a.get("answered_by", "")) for a in approvals] == [
        ("apply", "APPROVAL_STATE_PENDING", "")
    ], approvals
    plans = json.loads(cli("plan", "list", "--json").out)["plans"]
    assert [p["state"] for p in plans] == ["PLAN_STATE_AWAITING_APPROVAL"], plans


async def _failing_client(cli: Cli) -> None:
    site = tour(cli)
    recorder = Recorder(allow="error")
    command = agents_command("editor")
    async with spawn_agent_process(cast(Client, recorder), *command, env=_bridge_env(cli), cwd=site) as (
        conn,
        _,
    ):
        await _initialize(conn)
        created = await conn.new_session(cwd=str(site), mcp_servers=[])
        answer = await conn.prompt(session_id=created.session_id, prompt=[text_block("/hello name=Ada")])
        assert answer.stop_reason == "end_turn"
    assert len(recorder.asked) == 1
    assert recorder.asked[0].content[0].new_text == "Hello, Ada!\n"
    texts = "".join(u.content.text for u in recorder.kinds("agent_message_chunk"))
    assert "waits for approval" in texts, texts
    assert not (site / "hello.txt").exists()


def test_a_client_error_leaves_the_approval_pending(local_cli: Cli) -> None:
    asyncio.run(_failing_client(local_cli))
    _assert_pending(local_cli)


async def _step_approval(cli: Cli) -> None:
    site = tour(cli)
    spec = {"auto_execute": True, "auto_apply": True, "approval": {"ask": ["fs.write"]}}
    cli("automation-profile", "add", "careful", "--spec", json.dumps(spec))
    recorder = Recorder()
    command = agents_command("editor")
    async with spawn_agent_process(cast(Client, recorder), *command, env=_bridge_env(cli), cwd=site) as (
        conn,
        _,
    ):
        await _initialize(conn)
        created = await conn.new_session(cwd=str(site), mcp_servers=[])
        profile = json.dumps({"automation_profile": "careful"})
        cli(
            "session",
            "update",
            created.session_id,
            "--session",
            profile,
            "--update-mask",
            "automationProfile",
        )
        answer = await conn.prompt(session_id=created.session_id, prompt=[text_block("/hello name=Ada")])
        assert answer.stop_reason == "end_turn"
    # The step's request: the tool and its arguments, on the step's own tool call.
    assert [(c.kind, c.tool_call_id.endswith("/greet")) for c in recorder.asked] == [("edit", True)]
    text = recorder.asked[0].content[0].content.text
    assert text.startswith("fs.write "), text
    assert '"path": "hello.txt"' in text, text
    assert (site / "hello.txt").read_text() == "Hello, Ada!\n"


def test_a_step_approval_is_asked_with_the_tool_and_arguments(local_cli: Cli) -> None:
    asyncio.run(_step_approval(local_cli))
    approvals = json.loads(local_cli("approval", "list", "--json").out)["approvals"]
    assert [(a["kind"], a["tool"], a["answer"]) for a in approvals] == [
        ("step", "fs.write", "APPROVAL_ANSWER_ALLOW_ONCE")
    ], approvals


async def _cancel_while_asking(cli: Cli) -> None:
    site = tour(cli)
    recorder = Recorder(allow="wait")
    command = agents_command("editor")
    async with spawn_agent_process(cast(Client, recorder), *command, env=_bridge_env(cli), cwd=site) as (
        conn,
        _,
    ):
        await _initialize(conn)
        created = await conn.new_session(cwd=str(site), mcp_servers=[])
        prompt = asyncio.create_task(
            conn.prompt(session_id=created.session_id, prompt=[text_block("/hello name=Ada")])
        )
        await asyncio.wait_for(recorder.asking.wait(), 60)
        await conn.cancel(session_id=created.session_id)
        recorder.cancelled.set()
        answer = await asyncio.wait_for(prompt, 60)
        assert answer.stop_reason == "cancelled"
    assert not (site / "hello.txt").exists()


def test_session_cancel_while_asking_ends_the_prompt_and_never_answers_the_approval(local_cli: Cli) -> None:
    asyncio.run(_cancel_while_asking(local_cli))
    approvals = json.loads(local_cli("approval", "list", "--json").out)["approvals"]
    # Nobody answered it: the cancel of the plan voids it (docs/approvals.md), the bridge never allows.
    assert [(a["state"], a["answer"], a["answered_by"]) for a in approvals] == [
        ("APPROVAL_STATE_VOID", "APPROVAL_ANSWER_UNSPECIFIED", "")
    ], approvals


def _raw(cli: Cli, lines: list[str], *extra: str) -> tuple[list[dict[str, Any]], str]:
    """Send raw lines to a bridge, then close stdin: every line it printed, parsed."""
    done = subprocess.run(
        agents_command("editor", *extra),
        input="".join(line + "\n" for line in lines),
        capture_output=True,
        text=True,
        env=_bridge_env(cli),
        cwd=cli.cwd,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    answers = [json.loads(line) for line in done.stdout.splitlines()]
    assert all(a.get("jsonrpc") == "2.0" for a in answers), done.stdout
    return answers, done.stderr


def _request(ident: int, method: str, params: dict[str, Any]) -> str:
    return json.dumps({"jsonrpc": "2.0", "id": ident, "method": method, "params": params})


INIT = _request(1, "initialize", {"protocolVersion": PROTOCOL_VERSION, "clientCapabilities": {}})


def test_bad_input_gets_json_rpc_errors_and_the_bridge_keeps_running(local_cli: Cli) -> None:
    tour(local_cli)
    answers, _ = _raw(
        local_cli,
        [
            "{not json",
            "[1, 2]",
            '{"jsonrpc": "2.0", "id": 7}',
            _request(2, "session/teleport", {}),
            _request(3, "session/new", {"cwd": "/nowhere/at/all", "mcpServers": []}),
            _request(4, "session/new", {"cwd": "relative", "mcpServers": []}),
            _request(
                5,
                "session/prompt",
                {"sessionId": "01J00000000000000000000000", "prompt": [{"type": "text", "text": "hi"}]},
            ),
            INIT,
        ],
    )
    by_id = {a.get("id"): a for a in answers if a.get("id") is not None}
    nulls = [a["error"]["code"] for a in answers if a.get("id") is None]
    assert sorted(nulls) == [-32700, -32600], answers
    assert by_id[7]["error"]["code"] == -32600
    assert by_id[2]["error"]["code"] == -32601
    assert by_id[3]["error"]["code"] == -32002
    assert "agents project add" in by_id[3]["error"]["message"]
    assert by_id[4]["error"]["code"] == -32602
    assert "absolute" in by_id[4]["error"]["message"]
    assert by_id[5]["error"]["code"] == -32002
    assert "no session" in by_id[5]["error"]["message"]
    assert by_id[1]["result"]["agentCapabilities"]["loadSession"] is True


def test_a_session_of_another_namespace_is_not_found(
    cli_server: tuple[ServerProcess, Tokens], tmp_path: pathlib.Path
) -> None:
    server, tokens = cli_server
    env = {**clean_env(tmp_path), "ACP_SERVER": server.http, "ACP_TOKEN": tokens.tokens["alice"]}
    alice = Cli("http", env, tmp_path)
    session_id = alice("session", "create", "--value", "session.meta.id").out.strip()
    bob = Cli("http", {**env, "ACP_TOKEN": tokens.tokens["bob"]}, tmp_path)
    load = _request(2, "session/load", {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []})
    answers, _ = _raw(bob, [INIT, load, _request(3, "session/list", {})])
    by_id = {a["id"]: a for a in answers}
    assert by_id[2]["error"]["code"] == -32002, by_id[2]
    assert session_id not in json.dumps(by_id[3]["result"])


def test_stdout_is_json_rpc_alone_while_the_server_is_unreachable(tmp_path: pathlib.Path) -> None:
    env = {**clean_env(tmp_path), "ACP_SERVER": "http://127.0.0.1:9", "ACP_TOKEN": "acp_x"}
    cli = Cli("http", env, tmp_path)
    new = _request(2, "session/new", {"cwd": str(tmp_path), "mcpServers": []})
    answers, err = _raw(cli, [INIT, new], "--retry-attempts", "3", "--retry-seconds", "1")
    by_id = {a["id"]: a for a in answers}
    assert "result" in by_id[1]
    assert by_id[2]["error"]["code"] == -32603
    assert "cannot reach the ACP server" in by_id[2]["error"]["message"]
    assert by_id[2]["error"]["data"]["retryable"] is True
    assert "retrying" in err, err
