"""``events watch`` over a server that is killed and restarted (HTTP and gRPC at once), in
local mode following another process, and the live progress of ``plan execute --wait``."""

from __future__ import annotations

import json
import os
import pathlib
import pty
import selectors
import signal
import subprocess
import threading
import time

import pytest

from cleveragents.acp.client.cli.exits import EXIT_INTERRUPTED
from cleveragents.acp.v1 import events_pb2
from tests.client.cli.conftest import CLI_TIMEOUT, Cli, clean_env, make_cli
from tests.client.cli.test_flows import ACTION_SPEC
from tests.server_process import Children, Tokens, agents_command, kill_group, start_server

# Event types by payload (``plan_state_changed`` -> ``plan.state_changed``).
PAYLOADS = events_pb2.Event.DESCRIPTOR.oneofs_by_name["payload"].fields
EVENT_TYPES = {field.name.replace("_", ".", 1) for field in PAYLOADS}

WAIT = 30.0


class Lines:
    """Reads a child's stdout line by line, each wait bounded."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stdout is not None
        self.process = process
        self.fd = process.stdout.fileno()
        self.buffer = b""
        self.lines: list[str] = []

    def until(self, count: int, timeout: float = WAIT) -> list[str]:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            selector.register(self.fd, selectors.EVENT_READ)
            while len(self.lines) < count:
                remaining = deadline - time.monotonic()
                assert remaining > 0, f"only {self.lines}"
                if not selector.select(remaining):
                    continue
                chunk = os.read(self.fd, 65536)
                assert chunk, f"watch ended early: {self.lines}"
                self.buffer += chunk
                *complete, self.buffer = self.buffer.split(b"\n")
                self.lines += [line.decode() for line in complete]
        return self.lines


def _watch(
    children: Children, args: list[str], env: dict[str, str], stderr: pathlib.Path
) -> subprocess.Popen[bytes]:
    with stderr.open("w") as err:
        return children.popen(
            agents_command("events", "watch", *args),
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
        )


def _stop(process: subprocess.Popen[bytes], sig: int = signal.SIGINT) -> int:
    """Send ``sig`` and wait; a child that does not end is killed with its group (never
    left running), and the wait's failure is reported after."""
    if process.poll() is None:
        process.send_signal(sig)
    try:
        return process.wait(CLI_TIMEOUT)
    finally:
        if process.poll() is None:
            kill_group(process)
        assert process.stdout is not None
        process.stdout.close()


# The events of one tell to a client speaking ACP 1.3 (the CLI's version): the turn starts,
# the user's message and the orchestrator's reply, the turn ends.
TELL_EVENTS = ["session.turn_started", "session.message", "session.message", "session.turn_completed"]
TELL = len(TELL_EVENTS)


def test_watch_resumes_after_the_server_is_killed_and_restarted(
    tmp_path: pathlib.Path, children: Children
) -> None:
    tokens = Tokens.create(tmp_path)
    server = children.server(start_server(tmp_path, tokens=tokens.path, name="acp"))
    http_port, grpc_port = server.http.rsplit(":", 1)[1], server.grpc_target.rsplit(":", 1)[1]
    env = {**clean_env(tmp_path), "ACP_TOKEN": tokens.tokens["root"]}
    remote = Cli("http", {**env, "ACP_SERVER": server.http}, tmp_path)
    local = Cli("local", {**clean_env(tmp_path), "ACP_DB": str(tmp_path / "acp.db")}, tmp_path)
    watchers = [
        _watch(children, ["--json", "--server", server.http], env, tmp_path / "http.err"),
        _watch(children, ["--json", "--grpc", server.grpc_target], env, tmp_path / "grpc.err"),
    ]
    try:
        session_id = remote("session", "create", "--value", "session.meta.id").out.strip()
        remote("session", "tell", session_id, "one")
        readers = [Lines(w) for w in watchers]
        for reader in readers:
            reader.until(TELL)
        assert server.stop(signal.SIGKILL) == -signal.SIGKILL
        # While the server is down its database moves on; the watchers must get these too.
        local("session", "tell", session_id, "two")
        server = children.server(
            start_server(
                tmp_path, "--http-port", http_port, "--grpc-port", grpc_port, tokens=tokens.path, name="acp"
            )
        )
        remote("session", "tell", session_id, "three")
        for reader, name in zip(readers, ("http", "grpc"), strict=True):
            events = [json.loads(line) for line in reader.until(3 * TELL)]
            assert [e["sequence"] for e in events] == list(range(1, 3 * TELL + 1)), name
            assert [e["type"] for e in events] == 3 * TELL_EVENTS, name
            said = [e["session_message"]["message"]["content"] for e in events[1::TELL]]
            assert said == ["one", "two", "three"], name
    finally:
        try:
            statuses = [_stop(w) for w in watchers]
        finally:
            server.stop()
    assert statuses == [EXIT_INTERRUPTED, EXIT_INTERRUPTED]
    for name in ("http", "grpc"):
        err = (tmp_path / f"{name}.err").read_text()
        assert f"connection lost; reconnecting to resume after sequence {TELL}" in err, err
        assert "Traceback" not in err, err
    assert len(readers[0].lines) == 3 * TELL
    assert readers[0].buffer == b""


def _plan(cli: Cli) -> str:
    site = cli.cwd / "site"
    site.mkdir()
    (site / "notes.txt").write_text("a draft\n")
    (cli.cwd / "action.yaml").write_text(ACTION_SPEC)
    cli("resource", "add", "site", "--spec", json.dumps({"type": "directory", "path": str(site)}))
    cli("project", "add", "demo", "--spec", '{"resources": ["site"]}')
    cli("action", "add", "greet", "--spec", "action.yaml")
    return cli(
        "plan", "use", "greet", "demo", "--inputs", "name=World", "--value", "plan.meta.id"
    ).out.strip()


def test_local_watch_follows_another_process_until_the_run_ends(local_cli: Cli, children: Children) -> None:
    plan_id = _plan(local_cli)
    watcher = _watch(
        children, ["--plan", plan_id, "--until-done"], local_cli.env, local_cli.cwd / "watch.err"
    )
    try:
        reader = Lines(watcher)
        reader.until(2)  # the column headers and the first event
        # Local mode: the command returns once the background run it started is over.
        local_cli("plan", "execute", plan_id)
        assert local_cli("plan", "status", plan_id, "--value", "plan.state").out == "PLAN_STATE_SUCCEEDED\n"
        assert watcher.wait(WAIT) == 0
        assert watcher.stdout is not None
        reader.lines += [line.decode() for line in (reader.buffer + watcher.stdout.read()).splitlines()]
    finally:
        _stop(watcher)
    header, *events = reader.lines
    assert header.split() == ["SEQ", "TYPE", "PLAN", "SESSION", "DETAIL"], header
    sequences = [int(line.split()[0]) for line in events]
    assert sequences == sorted(set(sequences))
    kinds = [line.split()[1] for line in events]
    assert kinds[0] == "plan.created"
    assert kinds.count("tool.completed") == 2
    assert "execute: running -> succeeded" in events[-1]
    assert (local_cli.cwd / "watch.err").read_text() == ""


@pytest.mark.timeout(300)  # ten CLI processes; a busy 2-core box needs 10 s for each
@pytest.mark.parametrize("mode", ["local", "http"])
def test_until_done_on_a_finished_plan_shows_everything_through_rollback(
    request: pytest.FixtureRequest, tmp_path: pathlib.Path, mode: str
) -> None:
    """A plan executed, applied and rolled back: --until-done prints its whole story and
    stops after the rollback, not at the end of execute (issue 18, item 3)."""
    cli = make_cli(mode, tmp_path, request.getfixturevalue("cli_server") if mode == "http" else None)
    cli.cwd.joinpath("site").mkdir()
    (cli.cwd / "site" / "notes.txt").write_text("a draft\n")
    (cli.cwd / "action.yaml").write_text(ACTION_SPEC)
    n = cli.mode
    resource = json.dumps({"type": "directory", "path": str(cli.cwd / "site")})
    cli("resource", "add", f"until-{n}", "--spec", resource)
    cli("project", "add", f"until-{n}", "--spec", json.dumps({"resources": [f"until-{n}"]}))
    cli("action", "add", f"until-{n}", "--spec", "action.yaml")
    plan_id = cli(
        "plan", "use", f"until-{n}", f"until-{n}", "--inputs", "name=World", "--value", "plan.meta.id"
    ).out.strip()
    cli("plan", "execute", plan_id, "--wait")
    cli("plan", "apply", plan_id)
    cli("plan", "rollback", plan_id)
    header, *story = cli("events", "watch", "--plan", plan_id, "--until-done").out.splitlines()
    # Columns line up (issue 18, item 7): each value starts where its header does.
    starts = [header.index(name) for name in ("TYPE", "PLAN", "SESSION", "DETAIL")]
    assert header.split() == ["SEQ", "TYPE", "PLAN", "SESSION", "DETAIL"], header
    rows = [[line[a:b].strip() for a, b in zip([0, *starts], [*starts, None], strict=True)] for line in story]
    for line, (sequence, kind, plan, session, _) in zip(story, rows, strict=True):
        assert sequence.isdigit(), line
        assert (kind in EVENT_TYPES, plan, session) == (True, plan_id, "-"), line
        assert all(line[start - 2 : start] == "  " for start in starts if start < len(line)), line
    assert [int(row[0]) for row in rows] == sorted({int(row[0]) for row in rows}), story
    changes = [row[4] for row in rows if row[1] == "plan.state_changed"]
    assert changes[-3:] == [
        "apply: succeeded -> running",
        "apply: running -> succeeded",
        "apply: succeeded -> rolled_back",
    ], story
    assert "execute: running -> succeeded" in changes


def test_until_done_on_an_unknown_plan_is_not_found(local_cli: Cli) -> None:
    result = local_cli("events", "watch", "--plan", "nope", "--until-done", expect=None)
    assert result.status != 0
    assert result.err.startswith("NOT_FOUND"), result


def test_execute_wait_shows_live_progress_on_a_terminal(local_cli: Cli, children: Children) -> None:
    plan_id = _plan(local_cli)
    primary, secondary = pty.openpty()
    shown: list[bytes] = []

    def read_terminal() -> None:
        while True:
            try:
                chunk = os.read(primary, 65536)
            except OSError:
                return
            if not chunk:
                return
            shown.append(chunk)

    reader = threading.Thread(target=read_terminal, daemon=True)
    reader.start()
    try:
        process = children.popen(
            agents_command("plan", "execute", plan_id, "--wait"),
            env=local_cli.env,
            stdout=subprocess.PIPE,
            stderr=secondary,
        )
        os.close(secondary)
        out, _ = process.communicate(timeout=CLI_TIMEOUT)
        reader.join(WAIT)
    finally:
        os.close(primary)
    assert process.returncode == 0
    progress = b"".join(shown).decode()
    assert "tool.invoked" in progress, progress
    assert "tool.completed" in progress, progress
    assert "execute: running -> succeeded" in progress
    assert b"state: succeeded" in out
    assert b"\x1b[" not in out


def test_ctrl_c_interrupts_a_local_run(local_cli: Cli, children: Children) -> None:
    (local_cli.cwd / "site").mkdir()
    local_cli(
        "resource",
        "add",
        "site",
        "--spec",
        json.dumps({"type": "directory", "path": str(local_cli.cwd / "site")}),
    )
    local_cli("project", "add", "demo", "--spec", '{"resources": ["site"]}')
    local_cli("tool", "add", "nap", "--spec", '{"argv": ["sleep", "30"]}')
    local_cli("automation-profile", "add", "slow", "--spec", '{"allowed_tools": ["nap"]}')
    spec = {"actor": "scripted", "automation_profile": "slow", "steps": [{"id": "nap", "tool": "nap"}]}
    local_cli("action", "add", "nap", "--spec", json.dumps(spec))
    plan_id = local_cli("plan", "use", "nap", "demo", "--value", "plan.meta.id").out.strip()
    process = children.popen(
        agents_command("plan", "execute", plan_id, "--value", "plan.state"),
        env=local_cli.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # No preexec_fn to un-ignore SIGINT: tests/hygiene.py restores it in pytest, so the
        # child does not inherit it ignored; a preexec_fn would fork() a process that may have
        # gRPC threads running, and gRPC's fork handlers can kill the child before its exec.
    )
    lines = Lines(process)
    assert lines.until(1) == ["PLAN_STATE_RUNNING"]
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=WAIT)
    assert process.returncode == EXIT_INTERRUPTED
    assert b"Traceback" not in err
    status = json.loads(local_cli("plan", "status", plan_id, "--json").out)["plan"]
    assert status["state"] == "PLAN_STATE_FAILED"
    assert status["last_error"]["code"] == "interrupted"


def _ends_the_run(line: str) -> bool:
    changed: dict[str, str] = json.loads(line).get("plan_state_changed", {})
    return changed.get("phase") == "PLAN_PHASE_EXECUTE" and changed.get("to_state") == "PLAN_STATE_SUCCEEDED"


def test_watch_resumes_after_the_server_ends_it_as_too_slow(
    tmp_path: pathlib.Path, children: Children
) -> None:
    """With a queue of one event, a commit of two events (a plan's phase change: phase and
    state changed) ends a live subscriber (SUBSCRIBER_TOO_SLOW); the watchers subscribe
    again and miss nothing."""
    tokens = Tokens.create(tmp_path)
    server = children.server(
        start_server(tmp_path, tokens=tokens.path, env={"ACP_EVENT_QUEUE_SIZE": "1"}, name="slow")
    )
    env = {**clean_env(tmp_path), "ACP_TOKEN": tokens.tokens["root"]}
    remote = Cli("http", {**env, "ACP_SERVER": server.http}, tmp_path)
    watchers = [
        _watch(children, ["--json", "--server", server.http], env, tmp_path / "http.err"),
        _watch(children, ["--json", "--grpc", server.grpc_target], env, tmp_path / "grpc.err"),
    ]
    try:
        session_id = remote("session", "create", "--value", "session.meta.id").out.strip()
        remote("session", "tell", session_id, "one")
        remote("plan", "execute", _plan(remote), "--wait")
        for watcher in watchers:
            reader = Lines(watcher)
            while not _ends_the_run(reader.until(len(reader.lines) + 1)[-1]):
                assert len(reader.lines) < 100, reader.lines
            events = [json.loads(line) for line in reader.lines]
            assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    finally:
        statuses = [_stop(w) for w in watchers]
        assert server.stop() == 0, server.stderr()
    assert statuses == [EXIT_INTERRUPTED, EXIT_INTERRUPTED]
    errs = [(tmp_path / f"{name}.err").read_text() for name in ("http", "grpc")]
    assert all("Traceback" not in err for err in errs), errs
    assert all("fell behind; reconnecting to resume after sequence" in err for err in errs), errs


def test_watch_json_prints_each_event_with_its_sequence_a_number(local_cli: Cli) -> None:
    """One event a line, the shape of an Event (not wrapped in ``{"event": ...}``), its
    sequence a number a script can compare (proto JSON writes int64 as a string)."""
    plan_id = _plan(local_cli)
    local_cli("plan", "execute", plan_id, "--wait")
    out = local_cli("events", "watch", "--plan", plan_id, "--until-done", "--json").out
    events = [json.loads(line) for line in out.splitlines()]
    assert events[0]["type"] == "plan.created"
    assert events[0]["plan_id"] == plan_id
    sequences = [event["sequence"] for event in events]
    assert all(isinstance(s, int) for s in sequences), sequences
    assert sequences == sorted(set(sequences))
