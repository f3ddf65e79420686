"""The webhook operations: ``webhook.add|list|show|update|remove|rotate_secret|test|replay|
deliveries``. Namespaces are resolved and authorized on the call's context here, below
every transport; the URL rules (``egress.py``) run at add and update, off the store thread
(a DNS lookup is awaited, never waited for)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from ulid import ULID

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.access.webhook_egress import AddressRefusedError, WebhookEgress, refusal
from cleveragents.acp.facade.domain.events.log import check_event_types
from cleveragents.acp.facade.domain.paging import Pager
from cleveragents.acp.facade.domain.registries import check_name
from cleveragents.acp.facade.domain.registries.specs import invalid
from cleveragents.acp.facade.domain.webhooks import attempts, records, signing
from cleveragents.acp.facade.domain.webhooks.records import KIND, SECRET_KIND, STATE_KIND, Secrets, State
from cleveragents.acp.facade.domain.webhooks.sender import Limits
from cleveragents.acp.facade.store.base import (
    ListQuery,
    Record,
    StaleRevisionError,
    Store,
    StoreConflictError,
)
from cleveragents.acp.v1 import common_pb2, webhook_pb2

MAX_DESCRIPTION = 4096
DEFAULT_OVERLAP_SECONDS = 24 * 3600
MAX_OVERLAP_SECONDS = 7 * 24 * 3600
MASKABLE = frozenset({"description", "labels", "url", "filter", "enabled"})


class Poke:
    """What the service tells the deliverer of this process (``deliverer.Deliverer``)."""

    limits: Limits = Limits()

    def changed(self, webhook_id: str) -> None:
        """A subscription was added, changed, replayed or removed."""

    def tested(self, done: webhook_pb2.WebhookDelivery) -> None:
        """A ``webhook.test`` message was sent (counted in the metrics)."""


class Webhooks:
    def __init__(self, store: Store, egress: WebhookEgress, deliverer: Poke | None = None) -> None:
        self.store = store
        self.egress = egress
        self.deliverer = deliverer or Poke()
        self._pages = Pager(store)

    # reads -----------------------------------------------------------------------------

    async def show(
        self, ctx: CallContext, request: webhook_pb2.GetWebhookRequest
    ) -> webhook_pb2.GetWebhookResponse:
        namespace = ctx.namespace(request.namespace)
        check_name(request.name)
        shown = await self.store.read(
            lambda store: _shown(store, *records.load(store, namespace, request.name))
        )
        return webhook_pb2.GetWebhookResponse(webhook=shown)

    async def list(
        self, ctx: CallContext, request: webhook_pb2.ListWebhooksRequest
    ) -> webhook_pb2.ListWebhooksResponse:
        namespaces = ctx.visible_namespaces(request.namespace)
        labels = dict(request.labels)
        filters = {"namespaces": sorted(namespaces) if namespaces is not None else None, "labels": labels}

        def fetch(position: str | None, limit: int) -> list[webhook_pb2.Webhook]:
            after = tuple(json.loads(position)) if position is not None else None
            query = ListQuery(
                KIND,
                namespaces,
                labels=labels,
                by_name=True,
                after_name=after,
                limit=limit,
            )
            return [
                _shown(self.store, record, State.of(self.store.get(STATE_KIND, record.id)))
                for record in self.store.query(query)
            ]

        def read(store: Store) -> tuple[list[webhook_pb2.Webhook], str]:
            return self._pages.page(
                KIND, filters, request, fetch, lambda w: json.dumps([w.meta.namespace, w.name])
            )

        found, token = await self.store.read(read)
        return webhook_pb2.ListWebhooksResponse(webhooks=found, next_page_token=token)

    async def deliveries(
        self, ctx: CallContext, request: webhook_pb2.ListWebhookDeliveriesRequest
    ) -> webhook_pb2.ListWebhookDeliveriesResponse:
        namespace = ctx.namespace(request.namespace)
        check_name(request.name)

        def read(store: Store) -> tuple[list[webhook_pb2.WebhookDelivery], str]:
            record, _ = records.load(store, namespace, request.name)
            rows = [
                webhook_pb2.WebhookDelivery.FromString(body)
                for _, body in store.list_items(records.HISTORY_COLLECTION, record.id)
            ]
            rows.sort(key=lambda d: -d.number)

            def fetch(position: str | None, limit: int) -> list[webhook_pb2.WebhookDelivery]:
                below = int(position) if position is not None else None
                return [d for d in rows if below is None or d.number < below][:limit]

            return self._pages.page(
                "webhook_deliveries", {"id": record.id}, request, fetch, lambda d: str(d.number)
            )

        found, token = await self.store.read(read)
        return webhook_pb2.ListWebhookDeliveriesResponse(deliveries=found, next_page_token=token)

    # writes ----------------------------------------------------------------------------

    async def add(
        self, ctx: CallContext, request: webhook_pb2.AddWebhookRequest
    ) -> webhook_pb2.AddWebhookResponse:
        namespace = ctx.namespace(request.namespace)
        check_name(request.name)
        _check_description(request.description)
        _check_filter(request.filter)
        if request.cursor < 0:
            raise invalid("cursor", "must not be negative")
        await self._check_url(request.url)
        secret = signing.new_secret()

        def write(store: Store) -> webhook_pb2.Webhook:
            if store.get_by_name(KIND, namespace, request.name) is not None:
                raise _exists(namespace, request.name)
            now = time.time()
            stamp = records.timestamp(now)
            entry = webhook_pb2.Webhook(
                meta=common_pb2.EntityMeta(
                    id=str(ULID()), namespace=namespace, create_time=stamp, update_time=stamp
                ),
                name=request.name,
                description=request.description,
                labels=dict(request.labels),
                revision=1,
                url=request.url,
                filter=request.filter,
                enabled=not request.disabled,
            )
            state = State(cursor=request.cursor or store.last_sequence())
            try:
                store.insert(records.to_record(entry))
            except StoreConflictError:
                raise _exists(namespace, request.name) from None
            store.insert(state.record(entry.meta.id, namespace, now))
            store.insert(Secrets(secret).record(entry.meta.id, namespace, now))
            return _shown(store, records.to_record(entry), state)

        shown = await self.store.write(write)
        self.deliverer.changed(shown.meta.id)
        return webhook_pb2.AddWebhookResponse(webhook=shown, secret=secret)

    async def update(
        self, ctx: CallContext, request: webhook_pb2.UpdateWebhookRequest
    ) -> webhook_pb2.UpdateWebhookResponse:
        namespace = ctx.namespace(request.namespace)
        check_name(request.name)
        unknown = sorted(set(request.update_mask.paths) - MASKABLE)
        if unknown or not request.update_mask.paths:
            raise invalid(
                "update_mask", f"name the fields to change: {', '.join(sorted(MASKABLE))}", paths=unknown
            )
        fields = frozenset(request.update_mask.paths)
        if "description" in fields:
            _check_description(request.description)
        if "filter" in fields:
            _check_filter(request.filter)
        if "url" in fields:
            await self._check_url(request.url)

        def change(entry: webhook_pb2.Webhook, state: State) -> None:
            if "description" in fields:
                entry.description = request.description
            if "labels" in fields:
                entry.labels.clear()
                entry.labels.update(request.labels)
            if "url" in fields:
                entry.url = request.url
            if "filter" in fields:
                entry.filter.CopyFrom(request.filter)
            if "enabled" in fields:
                if request.enabled and not entry.enabled:
                    state.consecutive_failures = 0
                    state.disabled_reason = ""
                    state.next_attempt_time = 0.0
                entry.enabled = request.enabled

        shown = await self.store.write(
            lambda store: _change(store, namespace, request.name, request.revision, change)
        )
        self.deliverer.changed(shown.meta.id)
        return webhook_pb2.UpdateWebhookResponse(webhook=shown)

    async def remove(
        self, ctx: CallContext, request: webhook_pb2.RemoveWebhookRequest
    ) -> webhook_pb2.RemoveWebhookResponse:
        namespace = ctx.namespace(request.namespace)
        check_name(request.name)

        def write(store: Store) -> webhook_pb2.Webhook:
            record, state = records.load(store, namespace, request.name)
            if request.revision and request.revision != record.revision:
                raise _stale(request.name, request.revision, record.revision)
            shown = _shown(store, record, state)
            store.delete(KIND, record.id)
            store.delete(STATE_KIND, record.id)
            store.delete(SECRET_KIND, record.id)
            store.delete_items(records.HISTORY_COLLECTION, record.id)
            return shown

        shown = await self.store.write(write)
        self.deliverer.changed(shown.meta.id)
        return webhook_pb2.RemoveWebhookResponse(webhook=shown)

    async def rotate_secret(
        self, ctx: CallContext, request: webhook_pb2.RotateWebhookSecretRequest
    ) -> webhook_pb2.RotateWebhookSecretResponse:
        namespace = ctx.namespace(request.namespace)
        check_name(request.name)
        if not 0 <= request.overlap_seconds <= MAX_OVERLAP_SECONDS:
            raise invalid("overlap_seconds", f"must be from 0 (the default, 24 h) to {MAX_OVERLAP_SECONDS}")
        overlap = request.overlap_seconds or DEFAULT_OVERLAP_SECONDS
        secret = signing.new_secret()

        def write(store: Store) -> webhook_pb2.Webhook:
            record, state = records.load(store, namespace, request.name)
            found = store.get(SECRET_KIND, record.id)
            now = time.time()
            old = Secrets.of(found) if found is not None else Secrets("")
            rotated = Secrets(secret, old.current, now + overlap if old.current else 0.0)
            records.put(store, rotated.record(record.id, namespace, now))
            # The deliverer (of any process) signs with the new secret from its next message.
            state.epoch += 1
            records.put_state(store, record.id, namespace, state, now)
            return _shown(store, record, state)

        shown = await self.store.write(write)
        self.deliverer.changed(shown.meta.id)
        return webhook_pb2.RotateWebhookSecretResponse(webhook=shown, secret=secret)

    async def replay(
        self, ctx: CallContext, request: webhook_pb2.ReplayWebhookRequest
    ) -> webhook_pb2.ReplayWebhookResponse:
        namespace = ctx.namespace(request.namespace)
        check_name(request.name)
        if request.from_sequence < 1:
            raise invalid("from_sequence", "must be at least 1")

        def write(store: Store) -> webhook_pb2.Webhook:
            head = store.last_sequence()
            if request.from_sequence > head + 1:
                raise invalid("from_sequence", f"the event log ends at sequence {head}", head=head)

            def change(entry: webhook_pb2.Webhook, state: State) -> None:
                state.cursor = request.from_sequence - 1
                state.consecutive_failures = 0
                state.next_attempt_time = 0.0

            return _change(store, namespace, request.name, 0, change, bump=False)

        shown = await self.store.write(write)
        self.deliverer.changed(shown.meta.id)
        return webhook_pb2.ReplayWebhookResponse(webhook=shown)

    async def test(
        self, ctx: CallContext, request: webhook_pb2.TestWebhookRequest
    ) -> webhook_pb2.TestWebhookResponse:
        namespace = ctx.namespace(request.namespace)
        check_name(request.name)

        def read(store: Store) -> tuple[webhook_pb2.Webhook, Secrets]:
            record, _ = records.load(store, namespace, request.name)
            found = store.get(SECRET_KIND, record.id)
            if found is None:
                raise records.not_found(namespace, request.name)
            return records.stored(record), Secrets.of(found)

        entry, secrets_ = await self.store.read(read)
        done = await attempts.send_test(self.store, self.egress, self.deliverer.limits, entry, secrets_)
        self.deliverer.tested(done)
        return webhook_pb2.TestWebhookResponse(delivery=done)

    async def _check_url(self, url: str) -> None:
        try:
            await self.egress.resolve(self.egress.check_url(url))
        except AddressRefusedError as exc:
            raise refusal("url", exc) from None


def _shown(store: Store, record: Record, state: State) -> webhook_pb2.Webhook:
    found = store.get(SECRET_KIND, record.id)
    until = Secrets.of(found).previous_until if found is not None else 0.0
    return records.with_health(
        records.stored(record), state, store.last_sequence(), until if until > time.time() else 0.0
    )


def _change(
    store: Store,
    namespace: str,
    name: str,
    revision: int,
    change: Callable[[webhook_pb2.Webhook, State], None],
    *,
    bump: bool = True,
) -> webhook_pb2.Webhook:
    """In a write: apply ``change`` to the entry and its state at ``revision`` (0: any);
    the state's epoch moves, so the deliverer restarts from what is stored."""
    record, state = records.load(store, namespace, name)
    if revision and revision != record.revision:
        raise _stale(name, revision, record.revision)
    entry = records.stored(record)
    change(entry, state)
    now = time.time()
    if bump:
        entry.revision = record.revision + 1
        entry.meta.update_time.CopyFrom(records.timestamp(now))
    state.epoch += 1
    updated = records.to_record(entry)
    try:
        store.update(updated, expected_revision=record.revision)
    except StaleRevisionError as exc:
        raise _stale(name, revision, exc.current) from None
    records.put_state(store, record.id, namespace, state, now)
    return _shown(store, updated, state)


def _check_description(description: str) -> None:
    if len(description) > MAX_DESCRIPTION:
        raise invalid("description", f"must be at most {MAX_DESCRIPTION} characters")


def _check_filter(where: webhook_pb2.WebhookFilter) -> None:
    check_event_types(list(where.event_type))


def _exists(namespace: str, name: str) -> ACPError:
    return ACPError(
        ErrorCode.ALREADY_EXISTS,
        f"{name!r} is an existing webhook in namespace {namespace!r}",
        {"kind": "webhook", "namespace": namespace, "name": name},
        refinement="WEBHOOK_ALREADY_EXISTS",
    )


def _stale(name: str, revision: int, current: int) -> ACPError:
    details: dict[str, Any] = {
        "kind": "webhook",
        "name": name,
        "field": "revision",
        "revision": revision,
        "current_revision": current,
    }
    return ACPError(
        ErrorCode.INVALID_STATE,
        f"webhook {name!r} is at revision {current}, not {revision}: read it again",
        details,
    )
