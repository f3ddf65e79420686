"""The webhook operations (``webhook.*``): the domain's ``Webhooks`` serves each."""

from __future__ import annotations

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.facade.domain.webhooks.service import Webhooks
from cleveragents.acp.facade.handlers.table import handles
from cleveragents.acp.v1 import webhook_pb2 as pb


class WebhookHandlers:
    def __init__(self, webhooks: Webhooks) -> None:
        self._webhooks = webhooks

    @handles("webhook.list")
    async def ListWebhooks(
        self, request: pb.ListWebhooksRequest, ctx: CallContext
    ) -> pb.ListWebhooksResponse:
        return await self._webhooks.list(ctx, request)

    @handles("webhook.show")
    async def GetWebhook(self, request: pb.GetWebhookRequest, ctx: CallContext) -> pb.GetWebhookResponse:
        return await self._webhooks.show(ctx, request)

    @handles("webhook.add")
    async def AddWebhook(self, request: pb.AddWebhookRequest, ctx: CallContext) -> pb.AddWebhookResponse:
        return await self._webhooks.add(ctx, request)

    @handles("webhook.update")
    async def UpdateWebhook(
        self, request: pb.UpdateWebhookRequest, ctx: CallContext
    ) -> pb.UpdateWebhookResponse:
        return await self._webhooks.update(ctx, request)

    @handles("webhook.remove")
    async def RemoveWebhook(
        self, request: pb.RemoveWebhookRequest, ctx: CallContext
    ) -> pb.RemoveWebhookResponse:
        return await self._webhooks.remove(ctx, request)

    @handles("webhook.rotate_secret")
    async def RotateWebhookSecret(
        self, request: pb.RotateWebhookSecretRequest, ctx: CallContext
    ) -> pb.RotateWebhookSecretResponse:
        return await self._webhooks.rotate_secret(ctx, request)

    @handles("webhook.test")
    async def TestWebhook(self, request: pb.TestWebhookRequest, ctx: CallContext) -> pb.TestWebhookResponse:
        return await self._webhooks.test(ctx, request)

    @handles("webhook.replay")
    async def ReplayWebhook(
        self, request: pb.ReplayWebhookRequest, ctx: CallContext
    ) -> pb.ReplayWebhookResponse:
        return await self._webhooks.replay(ctx, request)

    @handles("webhook.deliveries")
    async def ListWebhookDeliveries(
        self, request: pb.ListWebhookDeliveriesRequest, ctx: CallContext
    ) -> pb.ListWebhookDeliveriesResponse:
        return await self._webhooks.deliveries(ctx, request)
