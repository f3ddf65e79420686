"""The token file and its authenticator: hashes only, reload on change, fail closed."""

from __future__ import annotations

import os
import pathlib
import stat
import time

import pytest

from cleveragents.acp.contract.call import Principal
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade import auth


def refused(authenticator: auth.TokenAuthenticator, token: str | None) -> ACPError:
    with pytest.raises(ACPError) as info:
        authenticator.authenticate(token)
    return info.value


def test_create_and_authenticate(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "tokens.toml"
    alice = auth.create_token(path, "alice", ["default", "team-a"])
    root = auth.create_token(path, "root", None)
    text = path.read_text()
    assert alice not in text
    assert root not in text
    assert auth.hash_token(alice) in text
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    authenticator = auth.TokenAuthenticator(path)
    assert authenticator.authenticate(alice) == Principal("alice", frozenset({"default", "team-a"}))
    assert authenticator.authenticate(root) == Principal("root", None)
    assert refused(authenticator, None).code == "AUTH_REQUIRED"
    assert refused(authenticator, "").code == "AUTH_REQUIRED"
    assert refused(authenticator, alice + "x").code == "AUTH_REQUIRED"
    assert [p.name for p in authenticator.principals] == ["alice", "root"]


def test_the_file_is_reread_when_it_changes(tmp_path: pathlib.Path) -> None:
    """A new token works within NEW_TOKEN_SECONDS; a removed one stops working within the
    check interval (the file is looked at once per interval while known tokens come, and
    once per NEW_TOKEN_SECONDS while unknown ones do)."""
    path = tmp_path / "tokens.toml"
    authenticator = auth.TokenAuthenticator(path, check_seconds=0.2)
    assert refused(authenticator, "acp_x").code == "AUTH_REQUIRED"
    token = auth.create_token(path, "late", ["default"])
    time.sleep(authenticator.new_token_seconds + 0.05)
    assert authenticator.authenticate(token).name == "late"
    other = auth.create_token(path, "later", None)
    time.sleep(authenticator.new_token_seconds + 0.05)
    assert authenticator.authenticate(other).name == "later"
    auth.write(path, [])
    time.sleep(0.25)
    assert refused(authenticator, token).code == "AUTH_REQUIRED"
    assert refused(authenticator, other).code == "AUTH_REQUIRED"


def test_a_removed_token_stops_working_within_a_second_by_default(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "tokens.toml"
    token = auth.create_token(path, "a", ["default"])
    authenticator = auth.TokenAuthenticator(path)
    assert authenticator.check_seconds <= 1.0
    assert authenticator.authenticate(token).name == "a"
    auth.write(path, [])
    time.sleep(authenticator.check_seconds + 0.05)
    assert refused(authenticator, token).code == "AUTH_REQUIRED"


def test_a_broken_file_refuses_every_token(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "tokens.toml"
    token = auth.create_token(path, "a", ["default"])
    authenticator = auth.TokenAuthenticator(path, check_seconds=0)
    path.write_text(path.read_text() + "\n[[principal]\n")
    os.utime(path, ns=(1, 1))
    assert refused(authenticator, token).code == "INTERNAL_ERROR"
    assert refused(authenticator, None).code == "AUTH_REQUIRED"


@pytest.mark.parametrize(
    "text",
    [
        "not toml [",
        'principal = "x"',
        "[[principal]]\nname = 'a'\n",
        "[[principal]]\nname = 'a'\ntoken_sha256 = 'abc'\nnamespaces = '*'\n",
        f"[[principal]]\nname = 'a'\ntoken_sha256 = '{'0' * 64}'\nnamespaces = []\n",
        f"[[principal]]\nname = 'a b'\ntoken_sha256 = '{'0' * 64}'\nnamespaces = '*'\n",
        f"[[principal]]\nname = 'a'\ntoken_sha256 = '{'0' * 64}'\nnamespaces = '*'\nrole = 'x'\n",
        f"[[principal]]\nname = 'a'\ntoken_sha256 = '{'0' * 64}'\nnamespaces = '*'\n" * 2,
        "[server]\nport = 1\n",
    ],
)
def test_malformed_files(text: str) -> None:
    with pytest.raises(auth.TokenFileError):
        auth.parse(text)


def test_create_refuses_bad_input(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "tokens.toml"
    auth.create_token(path, "a", ["default"])
    with pytest.raises(auth.TokenFileError, match="already exists"):
        auth.create_token(path, "a", None)
    with pytest.raises(auth.TokenFileError):
        auth.create_token(path, "b", [])
    with pytest.raises(auth.TokenFileError):
        auth.create_token(path, "b", ["bad namespace"])
    assert [e.name for e in auth.load(path)] == ["a"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_nothing_is_remembered_per_presented_token(tmp_path: pathlib.Path) -> None:
    """Issue 17 finding 6: unknown tokens were kept as dict keys (up to 1,024 of up to 4 MiB
    each); now a token over MAX_TOKEN_CHARS is refused unhashed and none is kept."""
    path = tmp_path / "tokens.toml"
    token = auth.create_token(path, "a", ["default"])
    authenticator = auth.TokenAuthenticator(path)
    before = set(vars(authenticator))
    for index in range(200):
        assert refused(authenticator, f"acp_wrong{index}").code == "AUTH_REQUIRED"
    huge = refused(authenticator, "acp_" + "x" * 3_000_000)
    assert huge.code == "AUTH_REQUIRED"
    assert huge.details["refinement"] == "TOKEN_TOO_LONG"
    assert set(vars(authenticator)) == before
    assert not any(isinstance(value, dict) for value in vars(authenticator).values())
    assert authenticator.authenticate(token).name == "a"


def test_unknown_tokens_look_at_the_file_at_most_once_per_interval(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unknown token made the server stat the token file on every request (a flood of
    wrong tokens was a flood of file system calls); now at most once per NEW_TOKEN_SECONDS,
    and a token created meanwhile works once that interval has passed."""
    path = tmp_path / "tokens.toml"
    auth.create_token(path, "a", ["default"])
    authenticator = auth.TokenAuthenticator(path, check_seconds=60, new_token_seconds=60)
    looks: list[object] = []
    real_stat = os.stat

    def counting(target: object, *args: object, **kwargs: object) -> os.stat_result:
        if target == path:
            looks.append(target)
        return real_stat(target, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", counting)
    for index in range(500):
        assert refused(authenticator, f"acp_wrong{index}").code == "AUTH_REQUIRED"
    # Every one falls within both intervals of the look the authenticator made at start.
    assert looks == [], len(looks)
    late = auth.create_token(path, "late", ["default"])
    assert refused(authenticator, late).code == "AUTH_REQUIRED"
    authenticator.new_token_seconds = 0.1
    time.sleep(0.15)
    # The first unknown token after the interval looks at once.
    assert authenticator.authenticate(late).name == "late"
    assert auth.NEW_TOKEN_SECONDS <= 1.0


def _flip(digest: str, index: int) -> str:
    """``digest`` with its hex character at ``index`` changed (and nothing else)."""
    return digest[:index] + ("0" if digest[index] != "0" else "1") + digest[index + 1 :]


def test_a_digest_matches_only_in_all_its_64_characters(tmp_path: pathlib.Path) -> None:
    """Principals whose current or previous digest differs from the token's in one hex
    character, at every position: none of them is the token's (a comparison of a prefix,
    a suffix or any 8 characters would let one in)."""
    token = auth.new_token()
    digest = auth.hash_token(token)
    never = time.time() + 3600
    near = [
        auth.TokenEntry(f"p{index}", _flip(digest, index), frozenset({"default"}))
        for index in range(len(digest))
    ]
    previous = [
        auth.TokenEntry(
            f"q{index}",
            auth.hash_token(auth.new_token()),
            frozenset({"default"}),
            previous_sha256=_flip(digest, index),
            previous_expires=never,
        )
        for index in range(len(digest))
    ]
    path = tmp_path / "tokens.toml"
    auth.write(path, [*near, *previous])
    authenticator = auth.TokenAuthenticator(path, check_seconds=0)
    assert refused(authenticator, token).message == "unknown or revoked token"
    auth.write(path, [*near, auth.TokenEntry("exact", digest, frozenset({"default"})), *previous])
    authenticator.reload()
    assert authenticator.authenticate(token).name == "exact"


def test_after_rotate_the_old_token_ends_with_its_own_expiry_at_the_latest(tmp_path: pathlib.Path) -> None:
    """A grace longer than the old token had left is cut to its expiry: rotating never
    lengthens the life of a token (even when the new one gets a longer life)."""
    path = tmp_path / "tokens.toml"
    auth.create_token(path, "a", ["default"], expires_in=120)
    (before,) = auth.load(path)
    auth.rotate_token(path, "a", grace_seconds=3600, expires_in=30 * 86400)
    (after,) = auth.load(path)
    assert after.previous_sha256 == before.token_sha256
    assert before.expires is not None
    assert after.expires is not None
    assert after.previous_expires == before.expires
    assert after.expires > before.expires
    # A grace shorter than the old token's life is kept as asked.
    auth.rotate_token(path, "a", grace_seconds=60)
    (again,) = auth.load(path)
    assert again.previous_expires is not None
    assert again.previous_expires < after.expires
    assert again.previous_expires <= time.time() + 61


def test_an_expired_principal_is_no_longer_known_by_name(tmp_path: pathlib.Path) -> None:
    """What stream tickets and open ticket streams ask (``principal_named``): an expired
    principal is gone there too, not only for its token."""
    path = tmp_path / "tokens.toml"
    auth.create_token(path, "a", ["default"], expires_in=3600)
    authenticator = auth.TokenAuthenticator(path, check_seconds=0)
    assert authenticator.principal_named("a") == Principal("a", frozenset({"default"}))
    (entry,) = auth.load(path)
    auth.write(
        path, [auth.TokenEntry(entry.name, entry.token_sha256, entry.namespaces, expires=time.time() - 1)]
    )
    assert authenticator.principal_named("a") is None
