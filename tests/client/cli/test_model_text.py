"""Model text in the CLI, against the fake OpenAI server (in a thread of the test process):
``session chat`` prints a model orchestrator's streamed reply once, with the plan it started;
``plan execute --wait`` shows the plan actor's text among its progress on a terminal."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import threading
from collections.abc import Iterator

import pytest

from tests.client.cli.conftest import CLI_TIMEOUT, Cli
from tests.facade.plans.model_world import KEY, KEY_ENV
from tests.fake_openai import FakeOpenAI, turn
from tests.server_process import Children, agents_command

CHAT_TEXT = "Starting the rename for you now."
DONE_TEXT = "It is running; watch it with events watch."
PLAN_TEXT = "I looked at the notes and they are fine."


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    server = FakeOpenAI().start_in_thread()
    yield server
    server.stop_thread()


def world(cli: Cli, fake: FakeOpenAI) -> None:
    cli.env[KEY_ENV] = KEY
    site = cli.cwd / "site"
    site.mkdir()
    (site / "notes.txt").write_text("a draft\n")
    cli("resource", "add", "site", "--spec", json.dumps({"type": "directory", "path": str(site)}))
    cli("project", "add", "demo", "--spec", '{"resources": ["site"]}')
    actor = {"provider": "openai", "model": "fake-model", "base_url": fake.base_url, "api_key_env": KEY_ENV}
    cli("actor", "add", "model", "--spec", json.dumps(actor))
    cli(
        "action",
        "add",
        "tidy",
        "--spec",
        json.dumps({"actor": "model", "prompt_template": "Tidy the notes."}),
    )


def test_chat_prints_a_streamed_reply_once_and_the_plan_it_started(local_cli: Cli, fake: FakeOpenAI) -> None:
    world(local_cli, fake)
    session_id = local_cli(
        "session", "create", "--project", "demo", "--orchestrator", "model", "--value", "session.meta.id"
    ).out.strip()
    fake.then(
        turn(CHAT_TEXT, [("start_plan", {"action": "tidy"})], pieces=6, delay=0.02),
        turn(DONE_TEXT, pieces=4, delay=0.02),
    )
    chat = local_cli("session", "chat", session_id, stdin="please tidy\n/help\n/quit\n")
    assert chat.out.count(CHAT_TEXT) == 1, chat.out
    assert chat.out.count(DONE_TEXT) == 1, chat.out
    assert "Started plan " in chat.out
    assert "/actions" in chat.out
    lines = chat.out.splitlines()
    assert lines.index(CHAT_TEXT) < next(i for i, line in enumerate(lines) if line.startswith("Started plan"))
    assert KEY not in chat.out + chat.err


def test_execute_wait_shows_the_models_text_on_a_terminal(
    local_cli: Cli, fake: FakeOpenAI, children: Children
) -> None:
    world(local_cli, fake)
    plan_id = local_cli("plan", "use", "tidy", "demo", "--value", "plan.meta.id").out.strip()
    fake.then(turn(PLAN_TEXT, pieces=5, delay=0.05))
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
        reader.join(30)
    finally:
        os.close(primary)
    assert process.returncode == 0
    progress = b"".join(shown).decode().replace("\r\n", "\n")
    assert f"  model> {PLAN_TEXT}\n" in progress, progress
    assert progress.index("plan.state_changed") < progress.index(PLAN_TEXT)
    assert b"state: succeeded" in out
