"""A writer process for the gap-free test: appends events in transactions that stay open a
random while after taking their sequences, and rolls some back; prints how many events it
committed, then ``done``.

``python pg_appender.py URL store|serial TRANSACTIONS SEED``: ``store`` appends through
PostgresStore; ``serial`` inserts into a table whose key is a BIGSERIAL (the way the issue
warns against), so the test can show its follower does catch a skip when there is one.
"""

from __future__ import annotations

import random
import sys
import time

import psycopg

from cleveragents.acp.facade.store.base import StoredEvent
from cleveragents.acp.facade.store.postgres import PostgresStore


class RollbackError(Exception):
    pass


def main(url: str, mode: str, transactions: int, seed: int) -> None:
    rng = random.Random(seed)
    committed = 0
    if mode == "store":
        store = PostgresStore(url)
        try:
            for _ in range(transactions):
                count = rng.randint(1, 3)
                try:
                    with store.transaction():
                        store.append_events(
                            [StoredEvent(0, "default", "probe", "", "", time.time(), b"x")] * count
                        )
                        time.sleep(rng.random() * 0.004)
                        if rng.random() < 0.2:
                            raise RollbackError
                    committed += count
                except RollbackError:
                    pass
        finally:
            store.close()
    else:
        with psycopg.connect(url, autocommit=True) as conn:
            for _ in range(transactions):
                with conn.transaction():
                    conn.execute("INSERT INTO serial_events DEFAULT VALUES")
                    time.sleep(rng.random() * 0.004)
                committed += 1
    print(committed, flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
