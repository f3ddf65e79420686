"""Expected revisions from the CLI (ACP 1.3): ``--if-revision`` on ``session update`` and
``session tell``, in local mode on a ``--db`` file."""

from __future__ import annotations

import json
import pathlib

from cleveragents.acp.contract.errors import TABLE
from tests.client.cli.conftest import Cli, Result, clean_env


def test_session_update_if_revision(tmp_path: pathlib.Path) -> None:
    cli = Cli("local", clean_env(tmp_path), tmp_path)
    db = ("--db", str(tmp_path / "local.db"))
    session_id = cli("session", "create", "--title", "t", "--value", "session.meta.id", *db).out.strip()

    def update(title: str, revision: int, *more: str, expect: int = 0) -> Result:
        words = ["session", "update", session_id, "--session", json.dumps({"title": title})]
        words += ["--update-mask", "title", "--if-revision", str(revision), *more, *db]
        return cli(*words, expect=expect)

    changed = update("new", 1, "--json")
    assert (json.loads(changed.out)["session"]["title"], json.loads(changed.out)["session"]["revision"]) == (
        "new",
        2,
    )
    # Stale: the exit code of INVALID_STATE, the mismatch said, nothing changed.
    stale = update("late", 1, expect=TABLE["INVALID_STATE"].exit_code)
    assert stale.out == ""
    assert stale.error == (
        f"INVALID_STATE: session {session_id} is at revision 2, not the expected revision 1; read it again"
    )
    envelope = update("late", 1, "--envelope", expect=TABLE["INVALID_STATE"].exit_code)
    error = json.loads(envelope.out)["error"]
    assert (error["code"], error["details"]) == (
        "INVALID_STATE",
        {"session_id": session_id, "expected": 1, "actual": 2, "refinement": "REVISION_MISMATCH"},
    )
    assert cli("session", "show", session_id, "--value", "session.title", *db).out.strip() == "new"
    # The revision read: updated, and the revision moves on.
    right = update("right", 2, "--json")
    assert (json.loads(right.out)["session"]["title"], json.loads(right.out)["session"]["revision"]) == (
        "right",
        3,
    )
    # session tell takes one too: a stale one stores no message.
    told = cli("session", "tell", session_id, "hello", "--if-revision", "2", *db, expect=None)
    assert told.status == TABLE["INVALID_STATE"].exit_code, told
    assert "not the expected revision 2" in told.error
    shown = json.loads(cli("session", "show", session_id, "--json", *db).out)
    assert (shown["session"]["message_count"], shown["session"]["revision"]) == (0, 3)
    cli("session", "tell", session_id, "hello", "--if-revision", "3", *db)
    assert cli("session", "show", session_id, "--value", "session.message_count", *db).out.strip() == "2"
