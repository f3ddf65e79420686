"""Bad input ends with a clear message and the usage on stderr, exit 2, no traceback and
nothing on stdout; a server that cannot be reached is one line naming it, exit 12."""

from __future__ import annotations

import pathlib
import socket

import pytest

from cleveragents.acp.client.cli.exits import EXIT_UNREACHABLE
from tests.client.cli.conftest import Cli, make_cli
from tests.server_process import ServerProcess, Tokens

SPEC_FILES = {
    "bad.json": '{"actor": "scripted", ',
    "bad.yaml": "actor: scripted\nsteps: [unclosed\n",
    "list.yaml": "- a\n- b\n",
}


@pytest.mark.parametrize(
    ("args", "stdin", "usage", "message"),
    [
        (["bogus"], None, "usage: agents [options] COMMAND", "unknown command 'bogus'"),
        (["sesion", "list"], None, "usage: agents", "did you mean 'session'?"),
        (["plan", "lst"], None, "usage: agents plan", "unknown command 'lst' (did you mean 'list'?)"),
        (
            ["session", "create", "--bogus"],
            None,
            "usage: agents session create",
            "unrecognized arguments: --bogus",
        ),
        (
            ["session", "create", "--titel", "x"],
            None,
            "usage: agents session create",
            "unrecognized arguments: --titel x (did you mean '--title'?)",
        ),
        (["plan", "list", "--jsn"], None, "usage: agents plan list", "(did you mean '--json'?)"),
        # A required flag mistyped: the missing one is named with the suggestion.
        (
            ["project", "add", "demo", "--specc", "{}"],
            None,
            "usage: agents project add",
            "arguments are required: --spec; '--specc' is not a flag (did you mean '--spec'?)",
        ),
        (
            ["project", "add", "demo", "--spec", '{"resourcez": []}'],
            None,
            "usage: agents project add",
            "spec.resourcez: ProjectSpec has no field 'resourcez' (its fields: resources)",
        ),
        (
            ["project", "add", "demo", "--spec", '{"resources": [1]}'],
            None,
            "usage:",
            "spec.resources.0: expected a string, got a number",
        ),
        (
            ["action", "add", "a", "--spec", '{"actor": "scripted", '],
            None,
            "usage:",
            "--spec: not valid JSON or YAML: line 1, column 23: Expecting property name",
        ),
        (
            ["action", "add", "a", "--spec", "bad.yaml"],
            None,
            "usage:",
            "--spec: not valid JSON or YAML: line 3, column 1: expected ',' or ']'",
        ),
        (["session", "show"], None, "usage: agents session show SESSION_ID", "required: SESSION_ID"),
        (["action", "add", "a"], None, "usage: agents action add NAME --spec", "required: --spec"),
        (["plan"], None, "examples:\n  agents plan apply PLAN_ID", "required: VERB"),
        (
            ["action", "add", "a", "--spec", "missing.yaml"],
            None,
            "usage:",
            "--spec: cannot read missing.yaml",
        ),
        (["action", "add", "a", "--spec", "."], None, "usage:", "--spec: cannot read ."),
        (["action", "add", "a", "--spec", "bad.json"], None, "usage:", "--spec: not valid JSON or YAML"),
        (["action", "add", "a", "--spec", "bad.yaml"], None, "usage:", "--spec: not valid JSON or YAML"),
        (["action", "add", "a", "--spec", "-"], "steps: [\n", "usage:", "--spec: not valid JSON or YAML"),
        (["action", "add", "a", "--spec", "{oops"], None, "usage:", "--spec: not valid JSON or YAML"),
        (
            ["action", "add", "a", "--spec", "list.yaml"],
            None,
            "usage:",
            "--spec: expected an object (ActionSpec)",
        ),
        (["action", "add", "a", "--spec", '{"typo": 1}'], None, "usage:", "ActionSpec has no field 'typo'"),
        (
            ["action", "add", "a", "--spec", '{"actor": "x", "actor": "y"}'],
            None,
            "usage:",
            "--spec: the key 'actor' appears twice in one JSON object",
        ),
        (
            ["session", "import", "--document", "bad.json"],
            None,
            "usage:",
            "--document: not valid JSON or YAML",
        ),
        (["plan", "use", "a", "p", "--inputs", "=x"], None, "usage:", "--inputs: expected KEY=VALUE"),
        (["plan", "list", "--page-size", "many"], None, "usage:", "--page-size: 'many' is not a number"),
        (["plan", "list", "--state", "weird"], None, "usage:", "invalid choice: 'weird'"),
        (
            ["events", "watch", "--until-done"],
            None,
            "usage: agents events watch",
            "--until-done needs --plan",
        ),
        (["--db", "x.db", "serve"], None, "usage: agents", "--db: only for commands that call operations"),
        (
            ["project", "add", "demo", "--spec", '{"resources": []}', "--value", "nme"],
            None,
            "usage: agents project add",
            "--value nme: the response has no field 'nme' (it has: project)",
        ),
        (
            ["session", "create", "--value", "session.meta.idd"],
            None,
            "usage: agents session create",
            "session.meta has no field 'idd'",
        ),
        (["session", "list", "--value", "sessions.first"], None, "usage:", "sessions is a list"),
        (["plan", "status", "p", "--value", "plan.state.name"], None, "usage:", "is a single value"),
        (["events", "watch", "--value", "evnt"], None, "usage: agents events watch", "no field 'evnt'"),
    ],
)
def test_bad_input_is_usage_and_exit_2(
    local_cli: Cli, args: list[str], stdin: str | None, usage: str, message: str
) -> None:
    for name, text in SPEC_FILES.items():
        (local_cli.cwd / name).write_text(text)
    result = local_cli(*args, stdin=stdin, expect=2)
    assert usage in result.err
    assert message in result.err
    assert result.out == ""
    assert not (local_cli.cwd / "local.db").exists(), "bad input must fail before connecting"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"ACP_SERVER": "localhost:8080"}, "expected a URL such as http://127.0.0.1:8080"),
        ({"ACP_SERVER": "http://127.0.0.1:1", "ACP_GRPC": "127.0.0.1:1"}, "either a server URL or a gRPC"),
        ({"ACP_PROFILE": "missing"}, "profile 'missing' asked for"),
        # A mistyped scheme is no SQLite file name: nothing is created, the password not shown.
        (
            {"ACP_DB": "postgressql://me:secret@127.0.0.1/acp"},
            "database 'postgressql://me:***@127.0.0.1/acp': unknown URL scheme 'postgressql://'",
        ),
        # A token with no server would be ignored by local mode: the server was forgotten.
        ({"ACP_TOKEN": "acp_x"}, "a token is for a server, but neither --server URL nor --grpc"),
        ({"ACP_GRPC": "http://127.0.0.1:1", "ACP_TOKEN": "t"}, "expected HOST:PORT such as 127.0.0.1:50051"),
    ],
)
def test_bad_connection_settings_are_exit_2(local_cli: Cli, env: dict[str, str], message: str) -> None:
    local_cli.env.pop("ACP_DB")
    local_cli.env.update(env)
    result = local_cli("session", "list", expect=2)
    assert result.err.startswith("agents: error: ")
    assert message in result.err
    assert "secret" not in result.err
    assert len(result.err.splitlines()) == 1
    assert sorted(p.name for p in local_cli.cwd.iterdir()) == [], "nothing is created"


def test_https_to_a_plain_http_server_says_it_does_not_speak_tls(
    tmp_path: pathlib.Path, cli_server: tuple[ServerProcess, Tokens]
) -> None:
    server, tokens = cli_server
    cli = make_cli("local", tmp_path, None)
    url = server.http.replace("http://", "https://")
    result = cli(
        "session", "list", "--server", url, "--token", tokens.tokens["root"], expect=EXIT_UNREACHABLE
    )
    assert result.err == (
        f"UNAVAILABLE: cannot reach the ACP server at {url} (TLS handshake failed: the server does not "
        "speak TLS; is its URL http:// rather than https://?)\n"
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.mark.parametrize("mode", ["http", "grpc"])
@pytest.mark.parametrize(
    "command", [["session", "list"], ["events", "watch"], ["plan", "execute", "p", "--wait"]]
)
def test_unreachable_server_is_one_line_and_exit_12(
    tmp_path: pathlib.Path, mode: str, command: list[str]
) -> None:
    port = _free_port()
    cli = make_cli("local", tmp_path, None)
    # Retrying (tests/client/cli/test_retry.py) would add a line per attempt: off here.
    cli.env["ACP_RETRY_ATTEMPTS"] = "1"
    address = f"http://127.0.0.1:{port}" if mode == "http" else f"127.0.0.1:{port}"
    flag = "--server" if mode == "http" else "--grpc"
    result = cli(*command, flag, address, "--token", "t", expect=EXIT_UNREACHABLE)
    expected = address if mode == "http" else f"grpc://{address}"
    assert result.err.startswith(f"UNAVAILABLE: cannot reach the ACP server at {expected} (")
    assert "refused" in result.err
    assert len(result.err.splitlines()) == 1
    assert result.out == ""


def test_unusable_local_database_is_one_line_and_exit_12(local_cli: Cli) -> None:
    (local_cli.cwd / "garbage.db").write_text("not a database")
    result = local_cli("session", "list", "--db", "garbage.db", expect=EXIT_UNREACHABLE)
    assert result.err == "UNAVAILABLE: cannot open the local database garbage.db: file is not a database\n"
