"""Whole flows through ``agents`` in each mode (local, HTTP, gRPC): a plan from resource to
rollback with the files on disk checked, registry CRUD, sessions with export and import."""

from __future__ import annotations

import json
import pathlib
import shlex

import pytest

from cleveragents.acp.client.cli.exits import EXIT_PLAN_FAILED
from cleveragents.acp.contract.errors import exit_code
from cleveragents.acp.facade.domain.models.functions import BUILTIN as FILE_TOOLS
from tests.client.cli.conftest import RETRY_NOTICE, Cli, Result

ACTION_SPEC = """\
actor: scripted
prompt_template: "Greet {{name}}"
inputs_schema:
  type: object
  required: [name]
  properties: {name: {type: string}}
steps:
  - id: greet
    tool: fs.write
    args: {path: hello.txt, content: "Hello, {{name}}!\\n"}
  - id: edit
    tool: fs.replace
    args: {path: notes.txt, old: draft, new: final}
"""


def test_plan_flow(cli: Cli, tmp_path: pathlib.Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "notes.txt").write_text("a draft\n")
    (tmp_path / "action.yaml").write_text(ACTION_SPEC)
    n = cli.mode
    resource = json.dumps({"type": "directory", "path": str(site)})
    assert (
        cli("resource", "add", f"site-{n}", "--spec", resource, "--value", "resource.name").out
        == f"site-{n}\n"
    )
    cli("project", "add", f"demo-{n}", "--spec", json.dumps({"resources": [f"site-{n}"]}))
    actors = cli("actor", "list").out
    assert actors.splitlines()[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert "scripted" in actors
    added = json.loads(cli("action", "add", f"greet-{n}", "--spec", "action.yaml", "--json").out)
    assert [step["id"] for step in added["action"]["spec"]["steps"]] == ["greet", "edit"]

    plan = cli("plan", "use", f"greet-{n}", f"demo-{n}", "--inputs", "name=World", "--value", "plan.meta.id")
    plan_id = plan.out.strip()
    executed = cli("plan", "execute", plan_id, "--wait")
    assert "phase: execute" in executed.out
    assert "state: succeeded" in executed.out
    assert not (site / "hello.txt").exists()

    diff = cli("plan", "diff", plan_id).out
    assert "--- /dev/null\n+++ b/hello.txt\n@@ -0,0 +1 @@\n+Hello, World!\n" in diff
    assert "-a draft\n+a final\n" in diff
    tree = cli("plan", "tree", plan_id).out
    assert "greet fs.write [succeeded]" in tree
    assert "└─" in tree
    # Each decision shows the id `plan correct PLAN_ID NODE_ID` needs.
    nodes = json.loads(cli("plan", "tree", plan_id, "--json").out)["nodes"]
    assert nodes
    for node in nodes:
        assert f"{node['question']} -> {node['choice']} [{node['id']}]" in tree, tree

    applied = json.loads(cli("plan", "apply", plan_id, "--json").out)
    assert sorted(applied["changed_paths"]) == ["hello.txt", "notes.txt"]
    assert (site / "hello.txt").read_text() == "Hello, World!\n"
    assert (site / "notes.txt").read_text() == "a final\n"
    again = cli("plan", "apply", plan_id, expect=exit_code("INVALID_STATE"))
    assert again.error.startswith("INVALID_STATE: ")
    assert again.out == ""

    rolled = cli("plan", "rollback", plan_id, "--value", "plan.state")
    assert rolled.out == "PLAN_STATE_ROLLED_BACK\n"
    assert not (site / "hello.txt").exists()
    assert (site / "notes.txt").read_text() == "a draft\n"
    listed = cli("plan", "list", "--project", f"demo-{n}").out.splitlines()
    assert listed[0].split()[:3] == ["ID", "NAMESPACE", "ACTION"]
    assert plan_id in listed[1]
    assert "rolled_back" in listed[1]
    assert "2/2" in listed[1]


def test_plan_input_errors_name_the_field(local_cli: Cli, tmp_path: pathlib.Path) -> None:
    (tmp_path / "action.yaml").write_text(ACTION_SPEC)
    local_cli("resource", "add", "site", "--spec", json.dumps({"type": "directory", "path": str(tmp_path)}))
    local_cli("project", "add", "demo", "--spec", '{"resources": ["site"]}')
    local_cli("action", "add", "greet", "--spec", "action.yaml")
    refused = local_cli("plan", "use", "greet", "demo", expect=exit_code("INVALID_PARAMS"))
    assert refused.err.startswith("INVALID_PARAMS: ")
    assert "name" in refused.err
    assert len(refused.err.splitlines()) == 1
    missing = local_cli("plan", "status", "nope", expect=exit_code("NOT_FOUND"))
    assert missing.err.startswith("NOT_FOUND: ")


def test_a_calls_error_is_the_last_line_after_any_retry_notices() -> None:
    """Under load a gRPC call may be retried: its notice comes first, the answer last."""
    notice = f"{RETRY_NOTICE}Deadline Exceeded); retrying in 0.5 s (attempt 1 of 6)"
    assert Result(5, "", f"{notice}\nNOT_FOUND: no skill 'x'\n").error == "NOT_FOUND: no skill 'x'"
    for wrong in ("", "NOT_FOUND: no skill 'x'\nsomething after\n", "a warning\nNOT_FOUND: no skill 'x'\n"):
        with pytest.raises(AssertionError):
            _ = Result(5, "", wrong).error


def test_registry_crud(cli: Cli) -> None:
    name = f"tone-{cli.mode}"
    added = cli(
        "skill", "add", name, "--spec", '{"instructions": "Be brief."}', "--labels", "team=a", "--json"
    )
    skill = json.loads(added.out)["skill"]
    assert skill["name"] == name
    assert skill["revision"] == 1
    assert skill["labels"] == {"team": "a"}
    assert cli("skill", "add", name, "--spec", "{}", expect=exit_code("ALREADY_EXISTS")).error.startswith(
        "ALREADY_EXISTS: "
    )

    table = cli("skill", "list").out.splitlines()
    assert table[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert table[0].split()[-1] == "REVISION"
    assert any(row.split()[:2] == ["default", name] for row in table[1:])
    assert name in [s["name"] for s in json.loads(cli("skill", "list", "--json").out)["skills"]]

    shown = cli("skill", "show", name).out
    assert f"name: {name}" in shown
    assert "instructions: Be brief." in shown

    stale = cli(
        "skill", "update", name, "--revision", "7", "--description", "x", expect=exit_code("INVALID_STATE")
    )
    assert "revision" in stale.error
    updated = cli(
        "skill",
        "update",
        name,
        "--revision",
        "1",
        "--description",
        "short replies",
        "--update-mask",
        "description",
    )
    assert "revision: 2" in updated.out
    assert "description: short replies" in updated.out
    assert "instructions: Be brief." in updated.out

    cli("skill", "remove", name)
    gone = cli("skill", "show", name, expect=exit_code("NOT_FOUND"))
    assert gone.error.startswith("NOT_FOUND: ")
    assert name in gone.error


def test_tool_list_shows_the_built_in_file_tools(local_cli: Cli) -> None:
    """The ``fs.*`` tools a step may name are listed, marked built-in; a registered command
    tool beside them is not marked (issue 18, item 7: the list said "no tools")."""
    local_cli("tool", "add", "greet", "--spec", '{"argv": ["echo", "hi"]}')
    rows = [line.split() for line in local_cli("tool", "list").out.splitlines()]
    assert rows[0][-1] == "BUILTIN", rows
    marked = {row[1] for row in rows[1:] if row[-1] == "yes"}
    assert marked == set(FILE_TOOLS)
    assert {row[1] for row in rows[1:]} - marked == {"greet"}
    shown = local_cli("tool", "show", "fs.read").out
    assert "builtin: 'true'" in shown or 'builtin: "true"' in shown, shown


def test_session_tell_export_import_and_chat(cli: Cli, tmp_path: pathlib.Path) -> None:
    session_id = cli(
        "session", "create", "--title", "cli", "--labels", "team=a", "--value", "session.meta.id"
    ).out
    session_id = session_id.strip()
    told = cli("session", "tell", session_id, "/help")
    assert told.out.startswith("I am the built-in orchestrator")

    exported = cli("session", "export", session_id, "--json")
    (tmp_path / "session.json").write_text(exported.out)
    assert json.loads(exported.out)["document"]["format"] == "cleveragents.acp.session"
    # A Struct holds numbers as doubles; whole ones print as integers, not 2.0 (issue 29).
    document = json.loads(exported.out)["document"]
    # Format version 2 (ACP 1.3): the document carries the session's turns, here the tell's one.
    assert (document["session"]["message_count"], document["version"]) == (2, 2)
    assert [(t["state"], t["message_id"]) for t in document["turns"]] == [
        ("TURN_STATE_SUCCEEDED", document["messages"][0]["id"])
    ]
    assert isinstance(document["session"]["message_count"], int)
    assert isinstance(document["version"], int)
    assert "message_count: 2\n" in cli("session", "export", session_id).out
    new_id = cli("session", "import", "--document", "session.json", "--new-id", "--value", "session.meta.id")
    new_id_text = new_id.out.strip()
    assert new_id_text
    assert new_id_text != session_id
    shown = json.loads(cli("session", "show", new_id_text, "--json").out)
    assert next(m["content"] for m in shown["messages"]) == "/help"
    assert shown["session"]["labels"] == {"team": "a"}
    assert len(shown["messages"]) == 2
    same_id = cli(
        "session", "import", "--document", "-", stdin=exported.out, expect=exit_code("ALREADY_EXISTS")
    )
    assert same_id.error.startswith("ALREADY_EXISTS: ")

    chat = cli("session", "chat", new_id_text, stdin="/help\n\nhello there\n/quit\nnot sent\n")
    assert chat.out.count("I am the built-in orchestrator") == 2
    messages = json.loads(cli("session", "show", new_id_text, "--json").out)["messages"]
    assert [m["content"] for m in messages if m["role"] == "MESSAGE_ROLE_USER"][-2:] == [
        "/help",
        "hello there",
    ]
    assert cli("session", "chat", "nope", stdin="hi\n", expect=exit_code("NOT_FOUND")).error.startswith(
        "NOT_FOUND"
    )


def test_execute_wait_on_a_plan_that_fails_exits_1(cli: Cli, tmp_path: pathlib.Path) -> None:
    """The response is the failed plan, not an error: a script must still see the failure."""
    n = cli.mode
    (tmp_path / "site").mkdir()
    cli(
        "resource",
        "add",
        f"fail-{n}",
        "--spec",
        json.dumps({"type": "directory", "path": str(tmp_path / "site")}),
    )
    cli("project", "add", f"fail-{n}", "--spec", json.dumps({"resources": [f"fail-{n}"]}))
    cli("tool", "add", f"false-{n}", "--spec", '{"argv": ["false"]}')
    cli("automation-profile", "add", f"fail-{n}", "--spec", json.dumps({"allowed_tools": [f"false-{n}"]}))
    spec = {
        "actor": "scripted",
        "automation_profile": f"fail-{n}",
        "steps": [{"id": "no", "tool": f"false-{n}"}],
    }
    cli("action", "add", f"fail-{n}", "--spec", json.dumps(spec))
    plan_id = cli("plan", "use", f"fail-{n}", f"fail-{n}", "--value", "plan.meta.id").out.strip()
    failed = cli("plan", "execute", plan_id, "--wait", "--value", "plan.state", expect=EXIT_PLAN_FAILED)
    assert failed.out == "PLAN_STATE_FAILED\n"
    assert failed.error.startswith(f"agents: plan {plan_id} failed: "), failed


@pytest.mark.parametrize("auto_execute", [False, True])
def test_the_command_use_recommends_ends_with_the_run(
    local_cli: Cli, tmp_path: pathlib.Path, auto_execute: bool
) -> None:
    """``/use``'s reply names a command to follow the plan; run as printed, it ends once the
    run does (a watch ``--until-done`` on a plan nobody executes would wait for ever)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "notes.txt").write_text("a draft\n")
    local_cli(
        "resource", "add", "site", "--spec", json.dumps({"type": "directory", "path": str(tmp_path / "site")})
    )
    local_cli("project", "add", "demo", "--spec", '{"resources": ["site"]}')
    local_cli("automation-profile", "add", "auto", "--spec", json.dumps({"auto_execute": auto_execute}))
    (tmp_path / "action.yaml").write_text(ACTION_SPEC + "automation_profile: auto\n")
    local_cli("action", "add", "greet", "--spec", "action.yaml")
    session = local_cli("session", "create", "--project", "demo", "--value", "session.meta.id").out.strip()
    reply = local_cli("session", "tell", session, "/use greet name=Ada").out
    command = reply.split("`")[1]
    assert command.startswith("agents "), reply
    followed = local_cli(*shlex.split(command)[1:])
    assert "succeeded" in followed.out, followed
    assert (
        local_cli("plan", "status", reply.split()[2], "--value", "plan.state").out == "PLAN_STATE_SUCCEEDED\n"
    )
