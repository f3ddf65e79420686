"""One attempt as the history keeps it, and the ``webhook.test`` message (sent by any
process, delivering or not)."""

from __future__ import annotations

import json
import time

from ulid import ULID

from cleveragents.acp.facade.domain.access.webhook_egress import WebhookEgress
from cleveragents.acp.facade.domain.webhooks import records, sender, signing
from cleveragents.acp.facade.domain.webhooks.records import KIND, STATE_KIND, Secrets, State, put_state
from cleveragents.acp.facade.store.base import Store
from cleveragents.acp.v1 import webhook_pb2

Result = webhook_pb2.WebhookDeliveryResult
RESULT_NAMES = {
    webhook_pb2.WEBHOOK_DELIVERY_RESULT_SUCCEEDED: "succeeded",
    webhook_pb2.WEBHOOK_DELIVERY_RESULT_FAILED: "failed",
    webhook_pb2.WEBHOOK_DELIVERY_RESULT_REFUSED: "refused",
    webhook_pb2.WEBHOOK_DELIVERY_RESULT_GONE: "gone",
}


def _result(outcome: sender.Outcome) -> Result.ValueType:
    if outcome.ok:
        return webhook_pb2.WEBHOOK_DELIVERY_RESULT_SUCCEEDED
    if outcome.refused:
        return webhook_pb2.WEBHOOK_DELIVERY_RESULT_REFUSED
    if outcome.status == 410:
        return webhook_pb2.WEBHOOK_DELIVERY_RESULT_GONE
    return webhook_pb2.WEBHOOK_DELIVERY_RESULT_FAILED


def delivery(
    outcome: sender.Outcome, message: str, sequence: int, event_type: str, attempt: int, when: float
) -> webhook_pb2.WebhookDelivery:
    return webhook_pb2.WebhookDelivery(
        delivery_id=message,
        sequence=sequence,
        event_type=event_type,
        attempt=attempt,
        result=_result(outcome),
        response_code=outcome.status,
        response_excerpt=outcome.excerpt,
        latency_ms=round(outcome.latency_ms, 3),
        time=records.timestamp(when),
        error=outcome.error,
    )


async def send_test(
    store: Store,
    egress: WebhookEgress,
    limits: sender.Limits,
    webhook: webhook_pb2.Webhook,
    secrets_: Secrets,
) -> webhook_pb2.WebhookDelivery:
    """One ``webhook.test`` message now (not from the log: id ``test-<ulid>``, sequence 0),
    recorded in the history like any attempt."""
    ident = f"test-{ULID()}"
    now = time.time()
    body = json.dumps(
        {
            "type": "webhook.test",
            "timestamp": records.timestamp(now).ToJsonString(),
            "data": {"name": webhook.name, "namespace": webhook.meta.namespace},
        },
        separators=(",", ":"),
    ).encode()
    headers = signing.headers(secrets_.signing(now), ident, int(now), body)
    outcome = await sender.post(egress, webhook.url, headers, body, limits)
    done = delivery(outcome, ident, 0, "webhook.test", 1, now)

    def write(store: Store) -> None:
        if store.get(KIND, webhook.meta.id) is not None:
            state = State.of(store.get(STATE_KIND, webhook.meta.id))
            done.number = state.attempts
            state.attempts += 1
            put_state(store, webhook.meta.id, webhook.meta.namespace, state, time.time())
            store.put_items(
                records.HISTORY_COLLECTION,
                webhook.meta.id,
                {records.history_row(done.number): done.SerializeToString()},
            )

    await store.write(write)
    return done
