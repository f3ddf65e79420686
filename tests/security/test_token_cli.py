"""``agents token create|list|rotate|revoke`` (issue 17, "What to build" 6): roles, expiry,
rotation with a grace period, revocation; bad input is a message and exit status 1."""

from __future__ import annotations

import pathlib

import pytest

from cleveragents.acp.client.cli.main import main
from cleveragents.acp.facade import auth


def agents(capsys: pytest.CaptureFixture[str], *args: str, expect: int = 0) -> tuple[str, str]:
    assert main(list(args)) == expect
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return out, err


def test_token_commands(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = str(tmp_path / "tokens.toml")
    reader, _ = agents(
        capsys, "token", "create", "--tokens", tokens, "--name", "ro", "--namespace", "default",
        "--role", "reader", "--expires-in", "12h",
    )  # fmt: skip
    writer, err = agents(capsys, "token", "create", "--tokens", tokens, "--name", "ci", "--all-namespaces")
    assert "(writer)" in err
    out, _ = agents(capsys, "token", "list", "--tokens", tokens)
    ro, ci = out.splitlines()
    assert ro.split("\t")[:3] == ["ro", "default", "reader"]
    assert ro.split("\t")[3].startswith("expires=20")
    assert ci.split("\t") == ["ci", "*", "writer", "expires=never"]
    assert reader.strip() not in out

    authenticator = auth.TokenAuthenticator(tokens, check_seconds=0)
    assert authenticator.authenticate(reader.strip()).role == "reader"
    rotated, err = agents(capsys, "token", "rotate", "--tokens", tokens, "ci", "--grace", "90s")
    assert "works for 90s more" in err
    assert authenticator.authenticate(rotated.strip()).name == "ci"
    assert authenticator.authenticate(writer.strip()).name == "ci"
    out, _ = agents(capsys, "token", "list", "--tokens", tokens)
    assert "previous-token-until=" in out.splitlines()[1]

    agents(capsys, "token", "revoke", "--tokens", tokens, "ro")
    out, _ = agents(capsys, "token", "list", "--tokens", tokens)
    assert [line.split("\t")[0] for line in out.splitlines()] == ["ci"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("create", "--name", "x", "--namespace", "d", "--expires-in", "soon"), "duration"),
        (("create", "--name", "x", "--namespace", "d", "--expires-in", "0s"), "duration"),
        (("rotate", "nobody"), "no principal"),
        (("revoke", "nobody"), "no principal"),
        (("rotate", "ci", "--grace", "forever"), "duration"),
    ],
)
def test_bad_token_commands(
    args: tuple[str, ...], message: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokens = tmp_path / "tokens.toml"
    auth.create_token(tokens, "ci", None)
    verb, *rest = args
    _, err = agents(capsys, "token", verb, "--tokens", str(tokens), *rest, expect=1)
    assert message in err
    assert [e.name for e in auth.load(tokens)] == ["ci"]


def test_bad_role_is_a_usage_error(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(
            [
                "token",
                "create",
                "--tokens",
                str(tmp_path / "t"),
                "--name",
                "x",
                "--all-namespaces",
                "--role",
                "root",
            ]
        )
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err
