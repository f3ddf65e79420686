"""Where the CLI connects: flags win over ACP_* variables, which win over the config file's
profile; options work before or after the command."""

from __future__ import annotations

import json
import pathlib

import pytest

from cleveragents.acp.client.cli import main
from cleveragents.acp.client.cli.connect import ConfigError, Connection, resolve
from tests.client.cli.conftest import Cli, make_cli
from tests.server_process import ServerProcess, Tokens

PROFILES = """\
default_profile = "work"
[profiles.work]
server = "https://acp.example.com"
token = "from-file"
acp_version = "1.0"
[profiles.other]
grpc = "other.example.com:50051"
[profiles.broken]
sever = "typo"
"""


@pytest.fixture
def config(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    for name in (
        "ACP_SERVER",
        "ACP_TOKEN",
        "ACP_GRPC",
        "ACP_DB",
        "ACP_CA_CERT",
        "ACP_VERSION",
        "ACP_PROFILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    path = tmp_path / "cleveragents" / "acp.toml"
    path.parent.mkdir()
    path.write_text(PROFILES)
    return path


def _resolve(*argv: str) -> Connection:
    return resolve(main.build_parser().parse_args([*argv, "meta", "version"]))


def test_flags_beat_environment_beat_profile(config: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from_file = _resolve()
    assert (from_file.server, from_file.token, from_file.acp_version) == (
        "https://acp.example.com",
        "from-file",
        "1.0",
    )
    monkeypatch.setenv("ACP_TOKEN", "from-env")
    assert _resolve().token == "from-env"
    assert _resolve("--token", "from-flag").token == "from-flag"
    after = resolve(main.build_parser().parse_args(["meta", "version", "--token", "after"]))
    assert after.token == "after"
    assert _resolve("--profile", "other").grpc == "other.example.com:50051"
    monkeypatch.setenv("ACP_PROFILE", "other")
    assert _resolve().grpc == "other.example.com:50051"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--profile", "nope"], "has no profile 'nope'"),
        (["--profile", "broken"], "unknown keys ['sever']"),
        (["--profile", "other", "--server", "http://h"], "either a server URL or a gRPC address"),
    ],
)
def test_unusable_settings_are_config_errors(config: pathlib.Path, argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _resolve(*argv)


def test_unreadable_config_file_is_a_config_error(config: pathlib.Path) -> None:
    config.write_text("default_profile = \n")
    with pytest.raises(ConfigError, match="cannot read"):
        _resolve()


def test_options_before_the_command_and_a_profile_db(local_cli: Cli) -> None:
    config = local_cli.cwd / "config" / "cleveragents" / "acp.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'default_profile = "mine"\n[profiles.mine]\ndb = "{local_cli.cwd / "profile.db"}"\n')
    del local_cli.env["ACP_DB"]
    created = local_cli("--json", "session", "create", "--title", "p")
    assert json.loads(created.out)["session"]["title"] == "p"
    assert (local_cli.cwd / "profile.db").exists()
    flagged = local_cli("--db", "flag.db", "session", "list", "--value", "sessions")
    assert flagged.out == "[]\n"


@pytest.mark.parametrize(
    "given",
    [
        "http://127.0.0.1:8080",
        "http://127.0.0.1:8080/",
        "http://127.0.0.1:8080/api/v1",
        "http://127.0.0.1:8080/api/v1/",
        "http://127.0.0.1:8080/api/v1/acp",
    ],
)
def test_the_api_address_names_the_server_by_its_origin(config: pathlib.Path, given: str) -> None:
    assert _resolve("--server", given).server == "http://127.0.0.1:8080"


def test_the_banners_http_address_works_as_server(
    cli_server: tuple[ServerProcess, Tokens], tmp_path: pathlib.Path
) -> None:
    """What ``agents serve`` prints after HTTP is what --server takes (issue 18, item 1)."""
    server, tokens = cli_server
    printed = [line.split()[1] for line in server.stdout if line.strip().startswith("HTTP ")]
    assert printed == [server.http], server.stdout
    cli = make_cli("local", tmp_path, None)
    del cli.env["ACP_DB"]
    for address in (printed[0], printed[0] + "/api/v1"):
        listed = cli("--server", address, "--token", tokens.tokens["root"], "session", "list", "--json")
        assert "sessions" in json.loads(listed.out)
