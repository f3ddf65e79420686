"""What every PostgreSQL connection of the store is opened with, so that a replica that
stops answering (frozen by SIGSTOP, a long pause, a VM stall; cut off; dead) cannot hold
the rows it locked, and with them the cluster, for longer than a stated bound:

- ``idle_in_transaction_session_timeout`` (``idle`` seconds, 10 by default): the server
  ends a session whose transaction waits on its client that long after a statement, and
  rolls it back, which frees its locks. Others' writes wait at most ``lock_timeout`` for a
  lock (then STORE_BUSY, retryable); recovery at start-up retries past this bound.
- TCP keepalives on both ends (libpq's ``keepalives*`` for the client's socket, the
  server's ``tcp_keepalives_*`` for the backend's): a peer gone without a word (a host
  powered off, a cable cut) is found within about 11 s, and ``tcp_user_timeout`` drops a
  connection whose sent data stays unacknowledged 15 s.

A value the URL already gives (``?keepalives_idle=30``, ``options=-c...``) is kept: the
operator's word wins over these defaults.
"""

from __future__ import annotations

from psycopg.conninfo import conninfo_to_dict, make_conninfo

DEFAULT_IDLE_SECONDS = 10.0
# How long opening a connection may take before the store gives up on the server.
CONNECT_TIMEOUT = 10
# libpq's: keepalives after 5 s of silence, every 2 s, 3 unanswered ones drop the socket.
CLIENT_KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "15000",
}
# The server's, for the backend's socket: the same figures.
_SERVER_KEEPALIVES = " ".join(
    f"-c tcp_{name}={value}"
    for name, value in (
        ("keepalives_idle", 5),
        ("keepalives_interval", 2),
        ("keepalives_count", 3),
        ("user_timeout", 15000),
    )
)


def server_options(idle: float) -> str:
    """The ``options`` the backend starts with (before the URL's own, which win)."""
    return f"-c idle_in_transaction_session_timeout={max(1, round(idle * 1000))} {_SERVER_KEEPALIVES}"


def connection_info(url: str, idle: float = DEFAULT_IDLE_SECONDS) -> str:
    """``url`` as a libpq connection string with the settings above added."""
    given = conninfo_to_dict(url)
    extra: dict[str, str] = {key: value for key, value in CLIENT_KEEPALIVES.items() if key not in given}
    theirs = str(given.get("options") or "")
    extra["options"] = f"{server_options(idle)} {theirs}".strip()
    return make_conninfo(url, **extra)


def first_schema(search_path: str) -> str | None:
    """The first schema a ``search_path`` setting names (``$user`` aside), unquoted."""
    names: list[str] = []
    current, quoted, i = "", False, 0
    while i < len(search_path):
        char = search_path[i]
        if quoted:
            if char == '"' and search_path[i + 1 : i + 2] == '"':
                current += '"'
                i += 1
            elif char == '"':
                quoted = False
            else:
                current += char
        elif char == '"':
            quoted = True
        elif char == ",":
            names.append(current.strip())
            current = ""
        else:
            current += char
        i += 1
    names.append(current.strip())
    return next((name for name in names if name and name != "$user"), None)
