"""Commands come from the catalog: an RPC in a test-only proto file (a private descriptor
pool) becomes ``agents <group> <verb>`` with arguments from its request, and no CLI code."""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message, text_format

from cleveragents.acp.client.cli import main, operations
from cleveragents.acp.contract import catalog, codec
from cleveragents.acp.contract.catalog import Operation
from tests.server_process import agents_command

WIDGET_PROTO = """
  name: "test/widget.proto" package: "test.widget" syntax: "proto3"
  dependency: "cleveragents/acp/v1/options.proto" dependency: "google/api/annotations.proto"
  dependency: "google/api/field_behavior.proto"
  message_type {
    name: "WidgetSpec"
    field { name: "size" number: 1 type: TYPE_INT32 label: LABEL_OPTIONAL }
    field { name: "colour" number: 2 type: TYPE_STRING label: LABEL_OPTIONAL }
  }
  message_type {
    name: "FrobWidgetRequest"
    field { name: "widget_id" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL
            options { [google.api.field_behavior]: REQUIRED } }
    field { name: "count" number: 2 type: TYPE_INT64 label: LABEL_OPTIONAL }
    field { name: "tags" number: 3 type: TYPE_STRING label: LABEL_REPEATED }
    field { name: "spec" number: 4 type: TYPE_MESSAGE type_name: ".test.widget.WidgetSpec"
            label: LABEL_OPTIONAL options { [google.api.field_behavior]: REQUIRED } }
    field { name: "dry_run" number: 5 type: TYPE_BOOL label: LABEL_OPTIONAL }
    field { name: "mode" number: 6 type: TYPE_ENUM type_name: ".test.widget.FrobMode" label: LABEL_OPTIONAL }
    field { name: "profile" number: 7 type: TYPE_STRING label: LABEL_OPTIONAL }
  }
  message_type {
    name: "FrobWidgetResponse" field { name: "done" number: 1 type: TYPE_BOOL label: LABEL_OPTIONAL }
  }
  enum_type {
    name: "FrobMode"
    value { name: "FROB_MODE_UNSPECIFIED" number: 0 }
    value { name: "FROB_MODE_GENTLE" number: 1 }
    value { name: "FROB_MODE_HARD" number: 2 }
  }
  service {
    name: "WidgetService"
    method {
      name: "FrobWidget"
      input_type: ".test.widget.FrobWidgetRequest" output_type: ".test.widget.FrobWidgetResponse"
      options {
        [cleveragents.acp.v1.operation] { name: "widget.frob" since: "1.1" summary: "Frob a widget." }
        [google.api.http] { post: "/api/v1/widgets/{widget_id}:frob" body: "*" }
      }
    }
  }
"""


def _widget_operations() -> list[Operation]:
    from google.api import annotations_pb2, field_behavior_pb2, http_pb2

    from cleveragents.acp.v1 import options_pb2

    pool = descriptor_pool.DescriptorPool()
    dependencies = (
        options_pb2.DESCRIPTOR.dependencies[0],
        options_pb2.DESCRIPTOR,
        http_pb2.DESCRIPTOR,
        annotations_pb2.DESCRIPTOR,
        field_behavior_pb2.DESCRIPTOR,
    )
    for dependency in dependencies:
        proto = descriptor_pb2.FileDescriptorProto()
        dependency.CopyToProto(proto)
        pool.Add(proto)
    pool.Add(text_format.Parse(WIDGET_PROTO, descriptor_pb2.FileDescriptorProto()))
    return list(catalog.build(iter([pool.FindFileByName("test/widget.proto")])).values())


@pytest.fixture
def widget_parser() -> tuple[argparse.ArgumentParser, list[tuple[Operation, message.Message]]]:
    calls: list[tuple[Operation, message.Message]] = []

    def run(op: Operation, request: message.Message, args: argparse.Namespace) -> int:
        calls.append((op, request))
        return 0

    parser = main.Parser(prog="agents")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    operations.register(subparsers, run, operations=_widget_operations())
    return parser, calls


def _run(parser: argparse.ArgumentParser, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            args = parser.parse_args(argv)
            handler: Any = args.handler
            status = handler(args)
        except SystemExit as exit_:
            status = int(exit_.code or 0)
    return status, out.getvalue(), err.getvalue()


def test_a_new_rpc_is_a_command_with_arguments_from_its_request(
    widget_parser: tuple[argparse.ArgumentParser, list[tuple[Operation, message.Message]]],
) -> None:
    parser, calls = widget_parser
    argv = ["widget", "frob", "w-1", "--spec", '{"size": 3, "colour": "red"}', "--count", "2"]
    # `profile` is also a connection option: after the command the field has the flag.
    argv += ["--tags", "a", "--tags", "b", "--dry-run", "--mode", "hard", "--profile", "p"]
    assert _run(parser, *argv)[0] == 0
    [(op, request)] = calls
    assert op.name == "widget.frob"
    assert codec.to_dict(request) == {
        "widget_id": "w-1",
        "count": "2",
        "tags": ["a", "b"],
        "spec": {"size": 3, "colour": "red"},
        "dry_run": True,
        "mode": "FROB_MODE_HARD",
        "profile": "p",
    }


def test_a_new_rpc_has_help_usage_and_checks(
    widget_parser: tuple[argparse.ArgumentParser, list[tuple[Operation, message.Message]]],
) -> None:
    parser, calls = widget_parser
    status, out, _ = _run(parser, "widget", "frob", "--help")
    assert status == 0
    assert out.startswith("usage: agents widget frob WIDGET_ID --spec FILE|-|JSON [options]")
    assert "Frob a widget." in out
    assert "ACP operation widget.frob (since 1.1)" in out
    assert "--spec takes WidgetSpec (JSON or YAML):\n  size: number\n  colour: string" in out
    assert re.search(r"--mode MODE\s+one of: gentle, hard", out)
    status, _, err = _run(parser, "widget", "frob", "w-1")
    assert status == 2
    assert "required: --spec" in err
    status, _, err = _run(parser, "widget", "frob", "w-1", "--spec", "{}", "--count", "lots")
    assert status == 2
    assert "--count: 'lots' is not a number" in err
    status, _, err = _run(parser, "widget", "frob", "w-1", "--spec", "{}", "--mode", "soft")
    assert status == 2
    assert "invalid choice: 'soft'" in err
    assert calls == []


def _parsers(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """Every (sub)parser below ``parser``, with its prog."""
    found = [(parser.prog, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in {id(p): p for p in action.choices.values()}.values():
                found += _parsers(sub)
    return found


def test_every_catalog_operation_is_a_command() -> None:
    parser = main.build_parser()
    for op in catalog.OPERATIONS.values():
        status, out, err = _run(parser, operations.cli_name(op.group), op.verb, "--help")
        assert status == 0, (op.name, err)
        assert f"ACP operation {op.name} " in out
        usage = out.split("\n\n", 1)[0]
        assert usage.startswith(f"usage: {operations.example(op)} [options]"), usage
        assert "example:" not in out, "an example repeating the usage line says nothing new"
    for prog, sub in _parsers(parser):
        silent = [a.option_strings for a in sub._actions if a.option_strings and not a.help]
        assert not silent, f"{prog}: options without help: {silent}"
    # The operation's own spelling of a group works too, without a second entry in the help.
    assert _run(parser, "automation_profile", "list", "--help")[0] == 0
    overview = _run(parser, "--help")[1]
    assert "automation-profile" in overview
    assert "automation_profile)" not in overview


def test_top_level_help_has_examples_and_exit_codes() -> None:
    done = subprocess.run(agents_command("--help"), capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.startswith("usage: agents [options] COMMAND ...")
    assert "examples:\n  agents session create --title demo" in done.stdout
    assert "exit status: 0 success, 1 the plan a --wait waited for failed" in done.stdout
    assert "2 bad usage, 3-11 one per ACP error code" in done.stdout
    for group in sorted({op.group for op in catalog.OPERATIONS.values()}):
        assert (
            f"\n    {operations.cli_name(group)} " in done.stdout
            or f"\n    {operations.cli_name(group)}\n" in (done.stdout)
        )


def test_the_serve_help_names_defaults_and_variables() -> None:
    """``agents --help`` offers a serve example that runs; ``serve --help`` shows where it
    listens by default and the variable behind each option (issue 18, item 5)."""
    parser = main.build_parser()
    overview = _run(parser, "--help")[1]
    lines = [line.strip() for line in overview.splitlines()]
    examples = [line.split("  ")[0] for line in lines if line.startswith("agents serve")]
    assert examples == ["agents serve --state-dir .acp"], examples
    assert parser.parse_args(examples[0].split()[1:]).state_dir == ".acp"
    out = " ".join(_run(parser, "serve", "--help")[1].split())
    for text in ("default 127.0.0.1", "default 8080", "default 50051", "ACP_TLS_CERT", "ACP_TLS_KEY"):
        assert text in out, text
    assert "--tls-cert FILE" in out


def _parsed(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[int, str, str, dict[str, Any]]:
    """What parsing ``argv`` prints and gives: the exit status, stdout, stderr, and the
    arguments (the handler by its name, the parsers it holds left out)."""
    out, err = io.StringIO(), io.StringIO()
    values: dict[str, Any] = {}
    status = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            args = parser.parse_args(argv)
            values = {k: v for k, v in vars(args).items() if k != "verbs"}
            values["handler"] = getattr(values.get("handler"), "__qualname__", None)
        except SystemExit as exit_:
            status = int(exit_.code or 0)
    return status, out.getvalue(), err.getvalue(), values


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--help"],
        ["--db", "x.db", "-h"],
        ["bogus"],
        ["sesion", "list"],
        ["automation_profil"],
        ["--json"],
        ["--bogus", "session", "list"],
        ["--", "session", "list"],
        ["session"],
        ["session", "--help"],
        ["session", "bogus"],
        ["session", "--bogus", "list"],
        ["session", "-h", "list"],
        ["session", "create", "--help"],
        ["session", "create", "--title", "t", "--db", "x.db", "--json"],
        ["session", "chat", "S1"],
        ["--db=x.db", "--json", "session", "show", "S1", "--value", "session.title"],
        ["plan", "execute", "P1", "--wait", "--tokn", "t"],
        ["plan", "use"],
        ["automation_profile", "list", "--help"],
        ["automation-profile", "show", "p"],
        ["events", "watch", "--plan", "P1", "--until-done"],
        ["events", "subscribe", "--help"],
        ["serve", "--help"],
        ["gateway", "--upstream", "h:1"],
        ["token", "--help"],
        ["token", "list", "--tokens", "t.toml"],
        ["--json", "token", "list"],
    ],
)
def test_a_parser_built_for_a_command_line_reads_it_as_the_whole_one(argv: list[str]) -> None:
    """``agents`` builds in full only the parsers a command line can reach (a command's
    start costs less): what it prints and parses must be the same as with every parser."""
    assert _parsed(main.build_parser(argv), argv) == _parsed(main.build_parser(), argv)


def test_the_command_words_are_those_argparse_reads() -> None:
    parser = main.build_parser([])
    assert main.command_words(parser, ["--db", "x", "--json", "plan", "use", "A"]) == ("plan", "use")
    assert main.command_words(parser, ["--db=x", "token", "list"]) == ("token", "list")
    assert main.command_words(parser, ["--db", "x", "-h", "plan"]) == ()
    assert main.command_words(parser, ["plan", "--help"]) == ("plan",)
    for unsure in (
        ["--bogus", "plan"],
        ["--", "plan"],
        ["--db", "-x", "plan"],
        ["--json=1"],
        ["plan", "--db"],
    ):
        assert main.command_words(parser, unsure) is None, unsure


def test_a_token_command_imports_neither_the_catalog_nor_the_client(tmp_path: Path) -> None:
    """``agents token`` runs where tokens are made (often before a server starts): it needs
    ``facade.auth``, not the catalog's descriptors nor a transport."""
    probe = (
        "import sys\n"
        "from cleveragents.acp.client.cli.main import main\n"
        f"status = main(['token', 'list', '--tokens', {str(tmp_path / 'tokens.toml')!r}])\n"
        "heavy = {'cleveragents.acp.contract.catalog', 'cleveragents.acp.client.acp_client', 'ulid'}\n"
        "assert 'cleveragents.acp.facade.auth' in sys.modules\n"
        "print(status, sorted(heavy & set(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout == "1 []\n", (done.stdout, done.stderr)
