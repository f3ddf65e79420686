"""``LocalTransport``: direct facade calls, with no serialization, no network and no auth."""

from __future__ import annotations

from cleveragents.acp.contract.transport import ServiceTransport
from cleveragents.acp.facade.service_facade import ServiceFacade


class LocalTransport(ServiceTransport):
    """The contract's ``ServiceTransport`` over a ``ServiceFacade``, which it may own."""

    def __init__(self, facade: ServiceFacade, *, owns_facade: bool = False) -> None:
        super().__init__(facade)
        self.facade = facade
        self._owns_facade = owns_facade

    async def close(self) -> None:
        if self._owns_facade:
            await self.facade.close()
