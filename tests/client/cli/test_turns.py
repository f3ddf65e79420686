"""Turns from the CLI (ACP 1.3): ``session tell --background --multitask``, ``session turn``
and ``session cancel`` (the alias of ``session cancel_turn``), against a real server."""

from __future__ import annotations

import json

import pytest

from tests.client.cli.conftest import Cli


@pytest.mark.parametrize("mode", ["http", "grpc"])
def test_background_tell_turn_and_cancel(mode: str, cli_server: object, tmp_path: object) -> None:
    from tests.client.cli.conftest import make_cli

    cli: Cli = make_cli(mode, tmp_path, cli_server)  # type: ignore[arg-type]
    session_id = cli("session", "create", "--multitask", "reject", "--value", "session.meta.id").out.strip()
    told = json.loads(
        cli("session", "tell", session_id, "/help", "--background", "--multitask", "enqueue", "--json").out
    )
    turn_id = told["turn"]["id"]
    assert told["turn"]["background"] is True
    assert told["turn"]["multitask"] == "MULTITASK_POLICY_ENQUEUE"
    assert told["replies"] == []
    for _ in range(500):
        turn = json.loads(cli("session", "turn", session_id, turn_id, "--json").out)
        if turn["turn"]["state"] == "TURN_STATE_SUCCEEDED":
            break
    assert turn["turn"]["state"] == "TURN_STATE_SUCCEEDED"
    assert [m["role"] for m in turn["messages"]] == ["MESSAGE_ROLE_USER", "MESSAGE_ROLE_ORCHESTRATOR"]
    # A finished turn cannot be cancelled: a clear error and a non-zero exit.
    refused = cli("session", "cancel", session_id, turn_id, expect=None)
    assert refused.status != 0
    assert "TURN_FINISHED" in refused.err or "already ended succeeded" in refused.err, refused
    bad = cli("session", "tell", session_id, "hi", "--multitask", "sometimes", expect=None)
    assert bad.status != 0
    assert "sometimes" in bad.err
