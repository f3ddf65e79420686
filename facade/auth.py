"""Bearer tokens of server mode: a TOML file of principals and the authenticator over it.

The file holds, per principal, a name, the SHA-256 of its token (never the token) and the
namespaces it may use (a list, or ``"*"`` for all)::

    [[principal]]
    name = "ci"
    token_sha256 = "9f86d0..."
    namespaces = ["default", "team-a"]

The server re-reads the file when it changes: a token created while it runs works at once
(an unknown token makes it look at the file right away), and a removed principal stops
working within ``CHECK_SECONDS`` (a known token makes it look at most once per interval,
so a call costs no file system access). A file that cannot be read fails closed: every
authenticated call is refused until it is fixed.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import os
import pathlib
import re
import secrets
import threading
import time
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cleveragents.acp.contract.call import Principal
from cleveragents.acp.contract.errors import ACPError, ErrorCode

log = logging.getLogger(__name__)

ALL_NAMESPACES = "*"
TOKEN_PREFIX = "acp_"
# Names and namespaces stay plain so the file needs no TOML escaping.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_UNREAD = object()
# How long a known token may outlive its removal from the file (seconds).
CHECK_SECONDS = 1.0
# Digests of recently seen tokens kept, so hashing is not repeated per call.
_DIGESTS_KEPT = 1024


class TokenFileError(Exception):
    """The token file is missing, unreadable or breaks the format."""


@dataclass(frozen=True)
class TokenEntry:
    name: str
    token_sha256: str
    # None: every namespace.
    namespaces: frozenset[str] | None

    @property
    def principal(self) -> Principal:
        return Principal(self.name, self.namespaces)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def check_name(value: str, what: str) -> str:
    if not _NAME.match(value):
        raise TokenFileError(
            f"{what} {value!r} must be 1-128 characters of letters, digits and _ . @ -, "
            "starting with a letter or digit"
        )
    return value


def _entry(raw: object, index: int) -> TokenEntry:
    where = f"principal #{index + 1}"
    if not isinstance(raw, dict):
        raise TokenFileError(f"{where} is not a table")
    unknown = sorted(set(raw) - {"name", "token_sha256", "namespaces"})
    if unknown:
        raise TokenFileError(f"{where} has unknown keys: {', '.join(unknown)}")
    name, digest, namespaces = raw.get("name"), raw.get("token_sha256"), raw.get("namespaces")
    if not isinstance(name, str):
        raise TokenFileError(f"{where} needs a name")
    check_name(name, f"{where} name")
    if not isinstance(digest, str) or not _HEX64.match(digest):
        raise TokenFileError(f"principal {name!r} needs token_sha256: 64 lowercase hex digits")
    if namespaces == ALL_NAMESPACES:
        return TokenEntry(name, digest, None)
    if not isinstance(namespaces, list) or not namespaces or not all(isinstance(n, str) for n in namespaces):
        raise TokenFileError(f'principal {name!r} needs namespaces: a non-empty list of names, or "*"')
    return TokenEntry(name, digest, frozenset(check_name(n, "namespace") for n in namespaces))


def parse(text: str) -> list[TokenEntry]:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TokenFileError(f"not valid TOML: {exc}") from None
    unknown = sorted(set(document) - {"principal"})
    if unknown:
        raise TokenFileError(f"unknown top-level keys: {', '.join(unknown)}")
    raw = document.get("principal", [])
    if not isinstance(raw, list):
        raise TokenFileError("principal must be an array of tables ([[principal]])")
    entries = [_entry(item, i) for i, item in enumerate(raw)]
    seen: set[str] = set()
    for entry in entries:
        if entry.name in seen:
            raise TokenFileError(f"principal {entry.name!r} is declared twice")
        seen.add(entry.name)
    return entries


def load(path: pathlib.Path) -> list[TokenEntry]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TokenFileError(f"cannot read token file {path}: {exc.strerror}") from None
    try:
        return parse(text)
    except TokenFileError as exc:
        raise TokenFileError(f"token file {path}: {exc}") from None


def render(entries: Iterable[TokenEntry]) -> str:
    lines = [
        "# CleverAgents ACP principals: SHA-256 hashes of bearer tokens, never the tokens.",
        "# Add one with: agents token create --tokens FILE --name NAME --namespace NS",
    ]
    for entry in entries:
        if entry.namespaces is None:
            namespaces = f'"{ALL_NAMESPACES}"'
        else:
            namespaces = "[" + ", ".join(f'"{n}"' for n in sorted(entry.namespaces)) + "]"
        lines += [
            "",
            "[[principal]]",
            f'name = "{entry.name}"',
            f'token_sha256 = "{entry.token_sha256}"',
            f"namespaces = {namespaces}",
        ]
    return "\n".join(lines) + "\n"


def write(path: pathlib.Path, entries: Sequence[TokenEntry]) -> None:
    """Replace the file atomically; it is created readable by its owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(render(entries))
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def create_token(path: pathlib.Path, name: str, namespaces: Sequence[str] | None) -> str:
    """Add a principal with a fresh random token and return the token (shown once).

    ``namespaces=None`` grants every namespace."""
    check_name(name, "name")
    allowed = None if namespaces is None else frozenset(check_name(n, "namespace") for n in namespaces)
    if allowed is not None and not allowed:
        raise TokenFileError("give at least one namespace, or all namespaces")
    entries = load(path) if path.exists() else []
    if any(entry.name == name for entry in entries):
        raise TokenFileError(f"principal {name!r} already exists in {path}")
    token = new_token()
    write(path, [*entries, TokenEntry(name, hash_token(token), allowed)])
    return token


class TokenAuthenticator:
    """``Authenticator`` over a token file, re-read whenever the file changes."""

    def __init__(self, path: str | pathlib.Path, *, check_seconds: float = CHECK_SECONDS) -> None:
        self.path = pathlib.Path(path)
        self.check_seconds = check_seconds
        self._lock = threading.Lock()
        self._stamp: object = _UNREAD
        self._checked = -math.inf
        # Entries and their digests, replaced together (readers take both at once).
        self._table: tuple[list[TokenEntry], list[bytes]] = ([], [])
        self._broken: str | None = None
        self._seen: dict[str, bytes] = {}
        self._refresh(force=True)

    def _refresh(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < self.check_seconds:
            return
        self._checked = now
        try:
            stat = os.stat(self.path)
            stamp = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        except FileNotFoundError:
            stamp = None
        with self._lock:
            if stamp == self._stamp:
                return
            self._stamp = stamp
            if stamp is None:
                self._set([], None)
                return
            try:
                self._set(load(self.path), None)
            except TokenFileError as exc:
                log.error("refusing every token until the file is fixed: %s", exc)
                self._set([], str(exc))

    def _set(self, entries: list[TokenEntry], broken: str | None) -> None:
        self._table = (entries, [entry.token_sha256.encode() for entry in entries])
        self._broken = broken

    @property
    def principals(self) -> list[Principal]:
        self._refresh(force=True)
        return [entry.principal for entry in self._table[0]]

    def principal_named(self, name: str) -> Principal | None:
        """The principal of that name as the file says now (None: removed); what a stream
        ticket's holder is checked against when the ticket is presented."""
        self._refresh()
        if self._broken is not None:
            return None
        for entry in self._table[0]:
            if entry.name == name:
                return entry.principal
        return None

    def _digest(self, token: str) -> bytes:
        digest = self._seen.get(token)
        if digest is None:
            if len(self._seen) >= _DIGESTS_KEPT:
                self._seen.clear()
            digest = self._seen[token] = hash_token(token).encode()
        return digest

    def _match(self, digest: bytes) -> TokenEntry | None:
        found: TokenEntry | None = None
        entries, digests = self._table
        # Every entry is compared, in constant time, so timing tells nothing about which matched.
        for entry, known in zip(entries, digests, strict=True):
            if hmac.compare_digest(digest, known):
                found = entry
        return found

    def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise ACPError(
                ErrorCode.AUTH_REQUIRED,
                "this operation needs a bearer token",
                {"scheme": "Bearer"},
            )
        self._refresh()
        digest = self._digest(token)
        found = self._match(digest) if self._broken is None else None
        if found is None:
            # Perhaps created (or the file fixed) since the last look: look now.
            self._refresh(force=True)
            if self._broken is not None:
                raise ACPError(
                    ErrorCode.INTERNAL_ERROR,
                    "the server's token file is unreadable; no token is accepted until it is fixed",
                )
            found = self._match(digest)
        if found is None:
            raise ACPError(ErrorCode.AUTH_REQUIRED, "unknown or revoked token", {"scheme": "Bearer"})
        return found.principal
