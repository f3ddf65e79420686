"""PostgreSQL URLs as the rest of the product sees them: which ``--db`` values name a
PostgreSQL server, and how to show one. Apart from ``postgres.py`` so that a server on the
embedded SQLite default never imports psycopg (about 10 MiB of resident memory).
"""

from __future__ import annotations

import re
import urllib.parse

SCHEMES = ("postgresql://", "postgres://")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def is_postgres_url(db: object) -> bool:
    return isinstance(db, str) and db.startswith(SCHEMES)


def db_problem(db: object) -> str | None:
    """Why ``db`` is no usable ``--db``: a URL of another scheme (``postgressql://``, a typo)
    would otherwise be taken for a SQLite file of that name and created."""
    if not isinstance(db, str) or is_postgres_url(db):
        return None
    url = _URL.match(db)
    if url is None:
        return None
    return (
        f"database {redacted(db)!r}: unknown URL scheme {url.group(1) + '://'!r}; a PostgreSQL "
        f"database is {' or '.join(SCHEMES)}..., anything else a SQLite file path"
    )


def redacted(url: str) -> str:
    """The URL without its password (in the authority or as a query parameter): what a
    banner or an error message may show."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostinfo = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{hostinfo}" if ":" in userinfo else f"{user}@{hostinfo}"
    # The query as given (its escapes kept), but a password's value.
    query = "&".join(
        f"{piece.split('=', 1)[0]}=***"
        if urllib.parse.unquote(piece.split("=", 1)[0]) == "password"
        else piece
        for piece in parts.query.split("&")
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
