"""What every PostgreSQL store connection is opened with (pg_settings.py): the bound on how
long a replica that stopped answering inside a transaction keeps its locks, and keepalives;
a value the URL gives itself wins."""

from __future__ import annotations

import pytest
from psycopg.conninfo import conninfo_to_dict

from cleveragents.acp.facade import factory
from cleveragents.acp.facade.store.pg_settings import connection_info
from cleveragents.acp.facade.store.postgres import PostgresStore
from tests import postgres


def test_the_urls_own_values_win() -> None:
    url = "postgresql://u@db.example:5433/acp?options=-csearch_path%3Dteam&keepalives_idle=30"
    given = conninfo_to_dict(connection_info(url, 2.5))
    assert given["keepalives_idle"] == "30"
    assert (given["keepalives"], given["keepalives_interval"], given["keepalives_count"]) == ("1", "2", "3")
    assert given["tcp_user_timeout"] == "15000"
    options = str(given["options"])
    # The URL's own options come last, so a `-c` of its own overrides ours.
    assert options.startswith("-c idle_in_transaction_session_timeout=2500 ")
    assert options.endswith(" -csearch_path=team")
    assert (given["host"], given["port"], given["dbname"], given["user"]) == (
        "db.example",
        "5433",
        "acp",
        "u",
    )


def test_every_connection_of_the_store_carries_the_bounds() -> None:
    with postgres.fresh_schema("settings") as url:
        store = PostgresStore(url, idle_timeout=2.5)
        try:
            settings = ("idle_in_transaction_session_timeout", "tcp_keepalives_idle", "tcp_user_timeout")
            shown = [store.execute(f"SHOW {name}")[0][0] for name in settings]
            assert shown == ["2500ms", "5", "15000"]
            assert store.execute("SELECT current_schema()")[0][0] == url.rsplit("search_path%3D", 1)[1]
        finally:
            store.close()


def test_the_bound_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with postgres.fresh_schema("settings") as url:
        for bad in ("0", "soon", "7200"):
            monkeypatch.setenv(factory.IDLE_ENV, bad)
            with pytest.raises(ValueError, match=factory.IDLE_ENV):
                factory.open_store(url)
        monkeypatch.setenv(factory.IDLE_ENV, "3")
        store = factory.open_store(url)
        try:
            assert isinstance(store, PostgresStore)
            assert store.execute("SHOW idle_in_transaction_session_timeout")[0][0] == "3s"
        finally:
            store.close()
