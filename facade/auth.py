"""Bearer tokens of server mode: a TOML file of principals and the authenticator over it.

The file holds, per principal, a name, the SHA-256 of its token (never the token), the
namespaces it may use (a list, or ``"*"`` for all), its role, and optionally when the token
expires and the digest of a rotated-out token with the end of its grace period::

    [[principal]]
    name = "ci"
    token_sha256 = "9f86d0..."
    namespaces = ["default", "team-a"]
    role = "writer"                      # reader | writer | admin (default writer)
    expires = 2026-12-31T00:00:00Z       # optional
    previous_sha256 = "1b4f0e..."        # optional: the token before `agents token rotate`
    previous_expires = 2026-12-01T12:00:00Z

The server re-reads the file when it changes: a token created while it runs works within
``NEW_TOKEN_SECONDS`` (an unknown token makes it look at the file, but at most once per that
interval, so a flood of wrong tokens costs at most a few ``stat`` calls a second, never one
per request), and a removed principal stops working within ``CHECK_SECONDS`` (a known token
makes it look at most once per interval, so a call costs no file system access). A file
that cannot be read fails closed: every authenticated call is refused until it is fixed.

Memory stays bounded whatever callers send: a token longer than ``MAX_TOKEN_CHARS`` is
refused before it is hashed, and nothing is remembered per presented token.
"""

from __future__ import annotations

import datetime
import functools
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
from dataclasses import dataclass, replace
from typing import Annotated, Literal

import pydantic

from cleveragents.acp.contract.call import Principal, Role
from cleveragents.acp.contract.errors import ACPError, ErrorCode

log = logging.getLogger(__name__)

ALL_NAMESPACES = "*"
TOKEN_PREFIX = "acp_"
# Our tokens are 47 characters; anything much longer is refused unhashed (issue 17, finding 6).
MAX_TOKEN_CHARS = 256
# Names and namespaces stay plain so the file needs no TOML escaping.
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,127}$"
_NAME = re.compile(_NAME_PATTERN)
_HEX64_PATTERN = r"^[0-9a-f]{64}$"
_UNREAD = object()
# How long a known token may outlive its removal from the file (seconds).
CHECK_SECONDS = 1.0
# How long a token added to the file may be refused as unknown (seconds): unknown tokens make
# the server look at the file at most once per this interval.
NEW_TOKEN_SECONDS = 0.5
# How long the old token keeps working after `agents token rotate`, by default.
DEFAULT_GRACE_SECONDS = 3600.0
_DURATION = re.compile(r"^([1-9][0-9]{0,8})([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_DURATION_SECONDS = 10 * 365 * 86400


class TokenFileError(Exception):
    """The token file is missing, unreadable or breaks the format."""


Name = Annotated[str, pydantic.StringConstraints(pattern=_NAME_PATTERN)]
Digest = Annotated[str, pydantic.StringConstraints(pattern=_HEX64_PATTERN)]


class _PrincipalTable(pydantic.BaseModel):
    """One ``[[principal]]`` table as the file holds it."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    name: Name
    token_sha256: Digest
    namespaces: Literal["*"] | Annotated[list[Name], pydantic.Field(min_length=1)]
    role: Role = Role.WRITER
    expires: pydantic.AwareDatetime | None = None
    previous_sha256: Digest | None = None
    previous_expires: pydantic.AwareDatetime | None = None

    @pydantic.model_validator(mode="after")
    def _previous_pair(self) -> _PrincipalTable:
        if (self.previous_sha256 is None) != (self.previous_expires is None):
            raise ValueError("previous_sha256 and previous_expires go together")
        return self


class _TokenFile(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")

    principal: list[_PrincipalTable] = []


def _epoch(value: datetime.datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def _stamp(epoch: float) -> str:
    """A TOML offset date-time, in UTC, to the second."""
    moment = datetime.datetime.fromtimestamp(epoch, datetime.UTC).replace(microsecond=0)
    return moment.isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class TokenEntry:
    name: str
    token_sha256: str
    # None: every namespace.
    namespaces: frozenset[str] | None
    role: Role = Role.WRITER
    # Seconds since the epoch; None: never.
    expires: float | None = None
    # The token replaced by `rotate`, valid until `previous_expires`.
    previous_sha256: str | None = None
    previous_expires: float | None = None

    @functools.cached_property
    def principal(self) -> Principal:
        """Made once per entry (a frozen dataclass costs a call's microsecond to build); an
        entry read again from the file is a new entry."""
        return Principal(self.name, self.namespaces, self.role)

    def expired(self, now: float) -> bool:
        return self.expires is not None and now >= self.expires


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


def parse_duration(text: str) -> float:
    """``90s``, ``15m``, ``12h``, ``30d`` as seconds (at most ten years)."""
    match = _DURATION.match(text.strip())
    if match is None:
        raise TokenFileError(f"duration {text!r} must be a whole number and a unit: 90s, 15m, 12h, 30d")
    seconds = int(match[1]) * _UNIT_SECONDS[match[2]]
    if seconds > MAX_DURATION_SECONDS:
        raise TokenFileError(f"duration {text!r} is longer than ten years")
    return float(seconds)


def _problem(error: pydantic.ValidationError, document: object) -> str:
    """The first problem of a validation error, named as the file names things."""
    first = error.errors()[0]
    location = list(first["loc"])
    where = "the file"
    if location[:1] == ["principal"] and len(location) > 1 and isinstance(location[1], int):
        index = location[1]
        where = f"principal #{index + 1}"
        tables = document.get("principal") if isinstance(document, dict) else None
        if isinstance(tables, list) and isinstance(tables[index], dict):
            name = tables[index].get("name")
            if isinstance(name, str):
                where = f"principal {name!r}"
        location = location[2:]
    field = ".".join(str(part) for part in location if not isinstance(part, int) or part > 0)
    message = first["msg"]
    if first["type"] == "extra_forbidden":
        message = "unknown key"
    if location[:1] == ["namespaces"]:
        field = "namespaces"
        message = 'must be a non-empty list of names (letters, digits and _ . @ -), or "*"'
    if location[:1] == ["name"]:
        message = (
            "must be 1-128 characters of letters, digits and _ . @ -, starting with one of the first two"
        )
    return f"{where}: {field}: {message}" if field else f"{where}: {message}"


def _entry(table: _PrincipalTable) -> TokenEntry:
    namespaces = None if table.namespaces == ALL_NAMESPACES else frozenset(table.namespaces)
    return TokenEntry(
        table.name,
        table.token_sha256,
        namespaces,
        table.role,
        _epoch(table.expires),
        table.previous_sha256,
        _epoch(table.previous_expires),
    )


def parse(text: str) -> list[TokenEntry]:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TokenFileError(f"not valid TOML: {exc}") from None
    try:
        parsed = _TokenFile.model_validate(document)
    except pydantic.ValidationError as exc:
        raise TokenFileError(_problem(exc, document)) from None
    entries = [_entry(table) for table in parsed.principal]
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
        "# Add one with: agents token create --tokens FILE --name NAME --namespace NS [--role ROLE]",
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
            f'role = "{entry.role}"',
        ]
        if entry.expires is not None:
            lines.append(f"expires = {_stamp(entry.expires)}")
        if entry.previous_sha256 is not None and entry.previous_expires is not None:
            lines.append(f'previous_sha256 = "{entry.previous_sha256}"')
            lines.append(f"previous_expires = {_stamp(entry.previous_expires)}")
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


def _expiry(expires_in: float | None, now: float) -> float | None:
    # Stored to the second: round up so a token never expires earlier than asked.
    return None if expires_in is None else float(math.ceil(now + expires_in))


def create_token(
    path: pathlib.Path,
    name: str,
    namespaces: Sequence[str] | None,
    *,
    role: Role | str = Role.WRITER,
    expires_in: float | None = None,
) -> str:
    """Add a principal with a fresh random token and return the token (shown once).

    ``namespaces=None`` grants every namespace; ``expires_in`` (seconds) limits its life."""
    check_name(name, "name")
    allowed = None if namespaces is None else frozenset(check_name(n, "namespace") for n in namespaces)
    if allowed is not None and not allowed:
        raise TokenFileError("give at least one namespace, or all namespaces")
    entries = load(path) if path.exists() else []
    if any(entry.name == name for entry in entries):
        raise TokenFileError(f"principal {name!r} already exists in {path}")
    token = new_token()
    entry = TokenEntry(name, hash_token(token), allowed, Role(role), _expiry(expires_in, time.time()))
    write(path, [*entries, entry])
    return token


def _named(entries: list[TokenEntry], name: str, path: pathlib.Path) -> int:
    for index, entry in enumerate(entries):
        if entry.name == name:
            return index
    raise TokenFileError(f"no principal {name!r} in {path}")


def revoke_token(path: pathlib.Path, name: str) -> None:
    """Remove a principal: its tokens stop working within ``CHECK_SECONDS``, streams included."""
    entries = load(path)
    del entries[_named(entries, name, path)]
    write(path, entries)


def rotate_token(
    path: pathlib.Path,
    name: str,
    *,
    grace_seconds: float = DEFAULT_GRACE_SECONDS,
    expires_in: float | None = None,
) -> str:
    """Give a principal a fresh token and return it; the old one keeps working for
    ``grace_seconds`` (0: not at all). ``expires_in`` sets the new token's life (default: the
    old token's remaining life, or none)."""
    entries = load(path)
    index = _named(entries, name, path)
    old = entries[index]
    now = time.time()
    token = new_token()
    grace_end = _expiry(grace_seconds, now) if grace_seconds > 0 else None
    if old.expires is not None and grace_end is not None:
        grace_end = min(grace_end, old.expires)
    entries[index] = replace(
        old,
        token_sha256=hash_token(token),
        expires=_expiry(expires_in, now) if expires_in is not None else old.expires,
        previous_sha256=old.token_sha256 if grace_end is not None else None,
        previous_expires=grace_end,
    )
    write(path, entries)
    return token


def _expired() -> ACPError:
    return ACPError(
        ErrorCode.AUTH_REQUIRED,
        "the token expired; ask the operator for a new one",
        {"scheme": "Bearer"},
        refinement="TOKEN_EXPIRED",
    )


def _unknown() -> ACPError:
    return ACPError(ErrorCode.AUTH_REQUIRED, "unknown or revoked token", {"scheme": "Bearer"})


class TokenAuthenticator:
    """``Authenticator`` over a token file, re-read whenever the file changes."""

    def __init__(
        self,
        path: str | pathlib.Path,
        *,
        check_seconds: float = CHECK_SECONDS,
        new_token_seconds: float = NEW_TOKEN_SECONDS,
    ) -> None:
        self.path = pathlib.Path(path)
        self.check_seconds = check_seconds
        self.new_token_seconds = new_token_seconds
        self._lock = threading.Lock()
        self._stamp: object = _UNREAD
        self._checked = -math.inf
        # Entries and their digests (current, previous), replaced together.
        self._table: tuple[list[TokenEntry], list[tuple[bytes, bytes | None]]] = ([], [])
        self._broken: str | None = None
        self._refresh(0.0)

    def reload(self) -> None:
        """Read the file now: a token its owner just wrote is known at once, whatever the
        ``new_token_seconds`` throttle says."""
        self._refresh(0.0)

    def _refresh(self, interval: float | None = None) -> None:
        """Look at the file unless it was looked at within ``interval`` seconds (default
        ``check_seconds``; 0: look now)."""
        now = time.monotonic()
        if now - self._checked < (self.check_seconds if interval is None else interval):
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
        digests = [
            (e.token_sha256.encode(), e.previous_sha256.encode() if e.previous_sha256 else None)
            for e in entries
        ]
        self._table = (entries, digests)
        self._broken = broken

    @property
    def principals(self) -> list[Principal]:
        self._refresh(0.0)
        return [entry.principal for entry in self._table[0]]

    def principal_named(self, name: str) -> Principal | None:
        """The principal of that name as the file says now (None: removed or expired); what
        a stream ticket's holder is checked against when the ticket is presented, and an
        open stream's while it runs."""
        self._refresh()
        if self._broken is not None:
            return None
        for entry in self._table[0]:
            if entry.name == name:
                return None if entry.expired(time.time()) else entry.principal
        return None

    def _match(self, digest: bytes) -> tuple[TokenEntry, bool] | None:
        """The entry whose current (True) or previous (False) token has ``digest``."""
        found: tuple[TokenEntry, bool] | None = None
        entries, digests = self._table
        # Every digest is compared, in constant time, so timing tells nothing about which matched.
        for entry, (current, previous) in zip(entries, digests, strict=True):
            if hmac.compare_digest(digest, current):
                found = (entry, True)
            if previous is not None and hmac.compare_digest(digest, previous):
                found = (entry, False)
        return found

    def authenticate(self, token: str | None) -> Principal:
        if not token:
            raise ACPError(
                ErrorCode.AUTH_REQUIRED,
                "this operation needs a bearer token",
                {"scheme": "Bearer"},
            )
        if len(token) > MAX_TOKEN_CHARS:
            raise ACPError(
                ErrorCode.AUTH_REQUIRED,
                f"unknown token (a token is at most {MAX_TOKEN_CHARS} characters)",
                {"scheme": "Bearer", "max_chars": MAX_TOKEN_CHARS},
                refinement="TOKEN_TOO_LONG",
            )
        self._refresh()
        digest = hash_token(token).encode()
        found = self._match(digest) if self._broken is None else None
        if found is None:
            # Perhaps created (or the file fixed) since the last look: look, unless an
            # unknown token made us look within the last ``new_token_seconds``.
            self._refresh(self.new_token_seconds)
            if self._broken is not None:
                raise ACPError(
                    ErrorCode.INTERNAL_ERROR,
                    "the server's token file is unreadable; no token is accepted until it is fixed",
                )
            found = self._match(digest)
        if found is None:
            raise _unknown()
        entry, current = found
        now = time.time()
        if entry.expired(now) or (
            not current and entry.previous_expires is not None and now >= entry.previous_expires
        ):
            raise _expired()
        return entry.principal
