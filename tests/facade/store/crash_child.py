"""Writes until killed, printing one ack line after each write returns (see test_crash)."""

from __future__ import annotations

import sys
import time

from cleveragents.acp.facade.domain.events import EventLog
from cleveragents.acp.facade.store.base import Record
from cleveragents.acp.facade.store.sqlite import SQLiteStore
from cleveragents.acp.v1 import events_pb2


def main(path: str, limit: int) -> None:
    store = SQLiteStore(path)
    log = EventLog(store)
    print("ready", flush=True)
    for i in range(limit):
        now = time.time()
        record_id = f"rec-{i:06d}"
        store.insert(Record(kind="session", id=record_id, namespace="default", body=b"x", create_time=now))
        print(f"record {record_id}", flush=True)
        store.append_items("messages", record_id, [f"message {i}".encode()])
        print(f"item {record_id}", flush=True)
        published = log.publish(
            events_pb2.Event(
                namespace="default",
                session_id=record_id,
                log_record=events_pb2.LogRecord(message=f"write {i}"),
            )
        )
        print(f"event {published.sequence} {record_id}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
