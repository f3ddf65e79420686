"""Webhook deliveries from the event log to a real receiver on loopback: every signature
verified by two libraries nobody here wrote (``standardwebhooks``, ``openai.webhooks``),
order and one logical delivery per event under random failures, 410 Gone and too many
failures disabling with a ``webhook.disabled`` event, secret rotation, replay, history."""

from __future__ import annotations

import asyncio
import json
import pathlib
import random
import time

import pytest
import standardwebhooks
from openai import InvalidWebhookSignatureError, OpenAI

from cleveragents.acp.client.cli.render import detail
from cleveragents.acp.client.local import LocalTransport
from cleveragents.acp.contract.acp_client import ACPClient
from cleveragents.acp.contract.errors import ACPError
from cleveragents.acp.facade.domain.webhooks import signing
from cleveragents.acp.facade.factory import open_facade
from cleveragents.acp.facade.service_facade import ServiceFacade
from cleveragents.acp.facade.store.base import EventFilter
from cleveragents.acp.v1 import webhook_pb2
from tests.facade.webhooks.helpers import LOOPBACK_POLICY, delivering, event_log, fast_retries, log_events
from tests.facade.webhooks.receiver import Received, Receiver


def _accepted_ids(receiver: Receiver) -> list[str]:
    """The receiver's log de-duplicated by webhook-id, in the order first accepted."""
    seen: dict[str, None] = {}
    for got in receiver.requests:
        if got.status == 200:
            seen.setdefault(got.headers["webhook-id"], None)
    return list(seen)


async def test_every_signature_verifies_with_standardwebhooks_and_openai(
    served: tuple[ServiceFacade, ACPClient],
) -> None:
    facade, client = served
    async with Receiver() as receiver:
        added = await client.ops.webhook.add(name="hook", url=receiver.url())
        assert added.secret.startswith("whsec_")
        await event_log(facade).append(log_events(20))
        await receiver.wait_for(lambda: len(receiver.requests) >= 20)
    verifier = standardwebhooks.Webhook(added.secret)
    openai = OpenAI(api_key="unused", webhook_secret=added.secret)
    for got in receiver.requests:
        assert json.loads(got.body) == verifier.verify(got.body, got.headers)
        openai.webhooks.verify_signature(got.body, got.headers)
        unwrapped: object = openai.webhooks.unwrap(got.body, got.headers)
        assert getattr(unwrapped, "type", None) == "log.record"
    first = receiver.requests[0]
    document = json.loads(first.body)
    assert first.headers["webhook-id"] == f"evt_{document['data']['sequence']}"
    assert document["type"] == "log.record"
    assert document["data"]["log_record"]["message"] == "m0"

    tampered = first.body.replace(b"m0", b"m9")
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        verifier.verify(tampered, first.headers)
    with pytest.raises(InvalidWebhookSignatureError):
        openai.webhooks.verify_signature(tampered, first.headers)
    with pytest.raises(InvalidWebhookSignatureError):
        openai.webhooks.unwrap(tampered, first.headers)
    stale = int(time.time()) - 3600
    old = signing.headers([added.secret], first.headers["webhook-id"], stale, first.body)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        verifier.verify(first.body, old)
    with pytest.raises(InvalidWebhookSignatureError):
        openai.webhooks.verify_signature(first.body, old)


async def test_order_and_one_logical_delivery_under_random_failures(
    served: tuple[ServiceFacade, ACPClient],
) -> None:
    """1,000 events across three plans, receivers failing 20% of requests at random: the
    de-duplicated log of each equals the event log for its filter, in order; every retry
    carries the id of its event."""
    facade, client = served
    rng = random.Random(37)

    def flaky(_: Received) -> tuple[int, bytes, dict[str, str]]:
        return (503, b"busy", {}) if rng.random() < 0.2 else (200, b"ok", {})

    async with Receiver(flaky) as everything, Receiver(flaky) as one_plan:
        await client.ops.webhook.add(name="all", url=everything.url())
        await client.ops.webhook.add(name="p2", url=one_plan.url(), filter={"plan_id": "p2"})
        log = event_log(facade)
        for _ in range(10):
            await log.append(log_events(100))
        store = log.store
        wanted_all = [e.sequence for e in await store.read(lambda s: s.read_events(0, 5000))]
        wanted_p2 = [
            e.sequence for e in await store.read(lambda s: s.read_events(0, 5000, EventFilter(plan_id="p2")))
        ]
        assert len(wanted_all) == 1000
        await everything.wait_for(lambda: len(_accepted_ids(everything)) >= 1000)
        await one_plan.wait_for(lambda: len(_accepted_ids(one_plan)) >= len(wanted_p2))
    assert _accepted_ids(everything) == [f"evt_{s}" for s in wanted_all]
    assert _accepted_ids(one_plan) == [f"evt_{s}" for s in wanted_p2]
    assert any(got.status == 503 for got in everything.requests)
    # Deliveries are strictly sequential: a request for a later event only once the earlier one was accepted.
    order = [int(got.headers["webhook-id"][4:]) for got in everything.requests]
    assert order == sorted(order)
    await _settled(client, "all", 1000)
    shown = await client.ops.webhook.show(name="all")
    assert shown.webhook.health.cursor == wanted_all[-1]
    assert shown.webhook.health.backlog == 0


async def _settled(client: ACPClient, name: str, delivered: int) -> None:
    """The bookkeeping is written behind the deliveries: wait until it caught up."""
    async with asyncio.timeout(30):
        while True:
            if (await client.ops.webhook.show(name=name)).webhook.health.delivered >= delivered:
                return
            await asyncio.sleep(0.05)


async def test_gone_disables_with_an_event(served: tuple[ServiceFacade, ACPClient]) -> None:
    facade, client = served
    async with Receiver(lambda _: (410, b"gone", {})) as receiver:
        await client.ops.webhook.add(name="gone", url=receiver.url())
        watch = client.subscribe(event_type=["webhook.disabled"])
        await event_log(facade).append(log_events(3))
        disabled = await anext(aiter(watch))
    assert disabled.webhook_disabled.name == "gone"
    assert "410" in disabled.webhook_disabled.reason
    assert detail(disabled) == "gone: the receiver answered 410 Gone"
    assert len(receiver.requests) == 1
    shown = (await client.ops.webhook.show(name="gone")).webhook
    assert not shown.enabled
    assert "410 Gone" in shown.health.disabled_reason
    history = await client.ops.webhook.deliveries(name="gone")
    assert [d.result for d in history.deliveries] == [webhook_pb2.WEBHOOK_DELIVERY_RESULT_GONE]
    assert history.deliveries[0].response_code == 410
    assert history.deliveries[0].response_excerpt == "gone"


async def test_consecutive_failures_disable_then_enabling_resumes(
    db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast_retries(monkeypatch, max_failures=3)
    facade = delivering(db_path)
    client = ACPClient(LocalTransport(facade))
    failing = True

    def answer(_: Received) -> tuple[int, bytes, dict[str, str]]:
        return (500, b"x" * 5000, {}) if failing else (200, b"", {})

    try:
        async with Receiver(answer) as receiver:
            await client.ops.webhook.add(name="down", url=receiver.url())
            watch = client.subscribe(event_type=["webhook.disabled"])
            await event_log(facade).append(log_events(2))
            disabled = await anext(aiter(watch))
            assert disabled.webhook_disabled.consecutive_failures == 3
            assert "3 consecutive failed attempts" in disabled.webhook_disabled.reason
            assert len(receiver.requests) == 3
            history = (await client.ops.webhook.deliveries(name="down")).deliveries
            assert [d.attempt for d in history] == [3, 2, 1]
            assert all(len(d.response_excerpt) == 1024 for d in history)
            failing = False
            shown = (await client.ops.webhook.show(name="down")).webhook
            await client.ops.webhook.update(
                name="down", revision=shown.revision, enabled=True, update_mask="enabled"
            )
            await receiver.wait_for(lambda: len(_accepted_ids(receiver)) == 2)
        assert _accepted_ids(receiver) == [
            receiver.requests[0].headers["webhook-id"],
            _accepted_ids(receiver)[1],
        ]
    finally:
        await client.close()
        await facade.close()


async def test_rotation_signs_with_both_secrets_for_the_overlap(
    served: tuple[ServiceFacade, ACPClient],
) -> None:
    facade, client = served
    async with Receiver() as receiver:
        added = await client.ops.webhook.add(name="rot", url=receiver.url())
        rotated = await client.ops.webhook.rotate_secret(name="rot", overlap_seconds=600)
        assert rotated.secret != added.secret
        assert rotated.webhook.HasField("previous_secret_expire_time")
        await event_log(facade).append(log_events(1))
        await receiver.wait_for(lambda: len(receiver.requests) >= 1)
    got = receiver.requests[0]
    assert len(got.headers["webhook-signature"].split(" ")) == 2
    for secret in (added.secret, rotated.secret):
        standardwebhooks.Webhook(secret).verify(got.body, got.headers)
        OpenAI(api_key="unused").webhooks.verify_signature(got.body, got.headers, secret=secret)


async def test_replay_from_a_sequence_and_the_test_message(served: tuple[ServiceFacade, ACPClient]) -> None:
    facade, client = served
    async with Receiver() as receiver:
        await client.ops.webhook.add(name="again", url=receiver.url())
        appended = await event_log(facade).append(log_events(5))
        await receiver.wait_for(lambda: len(receiver.requests) >= 5)
        await client.ops.webhook.replay(name="again", from_sequence=appended[2].sequence)
        await receiver.wait_for(lambda: len(receiver.requests) >= 8)
        tested = await client.ops.webhook.test(name="again")
    ids = [got.headers["webhook-id"] for got in receiver.requests]
    assert ids[:8] == [f"evt_{e.sequence}" for e in appended] + [f"evt_{e.sequence}" for e in appended[2:]]
    assert tested.delivery.result == webhook_pb2.WEBHOOK_DELIVERY_RESULT_SUCCEEDED
    assert ids[8] == tested.delivery.delivery_id
    assert tested.delivery.delivery_id.startswith("test-")
    assert json.loads(receiver.requests[8].body)["type"] == "webhook.test"


async def test_operations_refuse_what_they_cannot_do(served: tuple[ServiceFacade, ACPClient]) -> None:
    _, client = served
    async with Receiver() as receiver:
        added = await client.ops.webhook.add(name="one", url=receiver.url(), labels={"team": "a"})
        with pytest.raises(ACPError) as exists:
            await client.ops.webhook.add(name="one", url=receiver.url())
        assert exists.value.details["refinement"] == "WEBHOOK_ALREADY_EXISTS"
        with pytest.raises(ACPError) as missing:
            await client.ops.webhook.show(name="nope")
        assert missing.value.code == "NOT_FOUND"
        assert missing.value.details["refinement"] == "WEBHOOK_NOT_FOUND"
        with pytest.raises(ACPError) as stale:
            await client.ops.webhook.update(
                name="one", revision=7, description="x", update_mask="description"
            )
        assert stale.value.code == "INVALID_STATE"
        with pytest.raises(ACPError) as types:
            await client.ops.webhook.add(name="two", url=receiver.url(), filter={"event_type": ["no.such"]})
        assert types.value.code == "INVALID_PARAMS"
        with pytest.raises(ACPError) as replay:
            await client.ops.webhook.replay(name="one", from_sequence=10**6)
        assert replay.value.details["field"] == "from_sequence"
        listed = await client.ops.webhook.list(labels={"team": "a"})
        assert [w.name for w in listed.webhooks] == ["one"]
        assert listed.webhooks[0].revision == added.webhook.revision
        removed = await client.ops.webhook.remove(name="one")
        assert removed.webhook.name == "one"
        assert not (await client.ops.webhook.list()).webhooks


async def test_changes_made_by_another_process_reach_the_deliverer(
    db_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A replay and a disable made through another facade on the same database (a CLI call,
    another worker) reach the delivering one by its scan: it delivers again from the
    sequence, then stops."""
    fast_retries(monkeypatch)
    delivering_facade = delivering(db_path)
    other = open_facade(db_path, policy=LOOPBACK_POLICY, follow=True)
    client = ACPClient(LocalTransport(other))
    try:
        async with Receiver() as receiver:
            added = await client.ops.webhook.add(name="shared", url=receiver.url())
            lease = f"webhook:{added.webhook.meta.id}"
            appended = await event_log(other).append(log_events(3))
            await receiver.wait_for(lambda: len(receiver.requests) >= 3)
            await client.ops.webhook.replay(name="shared", from_sequence=appended[1].sequence)
            await receiver.wait_for(lambda: len(receiver.requests) >= 5)
            shown = (await client.ops.webhook.show(name="shared")).webhook
            await client.ops.webhook.update(name="shared", revision=shown.revision, update_mask="enabled")
            store = event_log(other).store
            async with asyncio.timeout(10):
                # Disabled: the deliverer lets the subscription's lease go.
                while True:
                    found = await store.read(lambda s: s.get_lease(lease))
                    if found is None or not found.owner:
                        break
                    await asyncio.sleep(0.05)
            await event_log(other).append(log_events(2))
        ids = [got.headers["webhook-id"] for got in receiver.requests]
        assert ids == [f"evt_{e.sequence}" for e in appended] + [f"evt_{e.sequence}" for e in appended[1:]]
    finally:
        await client.close()
        await other.close()
        await delivering_facade.close()
