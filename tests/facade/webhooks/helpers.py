"""What the webhook tests share: a delivering facade on a real SQLite file whose operator
lets webhooks reach loopback over plain http, and events appended to its real log."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence

import pytest

from cleveragents.acp.facade.domain.access.policy import Policy
from cleveragents.acp.facade.domain.events.log import EventLog
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.v1 import events_pb2

LOOPBACK_POLICY = Policy.server(webhook_allow_http=True, webhook_allow_networks=["127.0.0.1/32"])


def fast_retries(monkeypatch: pytest.MonkeyPatch, *, max_failures: int = 10) -> None:
    """Retries at once, changes seen within 50 ms: the schedule is a setting (docs/webhooks.md)."""
    monkeypatch.setenv("ACP_WEBHOOK_RETRY_SCHEDULE", "0")
    monkeypatch.setenv("ACP_WEBHOOK_SCAN_SECONDS", "0.05")
    monkeypatch.setenv("ACP_WEBHOOK_MAX_FAILURES", str(max_failures))


def delivering(db: pathlib.Path | str, policy: Policy = LOOPBACK_POLICY) -> ServiceFacade:
    facade = open_facade(db, policy=policy, deliver_webhooks=True)
    facade.start()
    return facade


def event_log(facade: ServiceFacade) -> EventLog:
    for resource in facade._resources:
        found = getattr(resource, "events", None)
        if isinstance(found, EventLog):
            return found
    raise AssertionError("the facade has no event log")


def log_events(
    count: int, plans: Sequence[str] = ("p1", "p2", "p3"), namespace: str = "default"
) -> list[events_pb2.Event]:
    return [
        events_pb2.Event(
            namespace=namespace,
            plan_id=plans[i % len(plans)],
            log_record=events_pb2.LogRecord(level="info", message=f"m{i}"),
        )
        for i in range(count)
    ]
