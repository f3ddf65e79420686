"""A delivering replica for test_takeover.py: the facade a server opens (``open_facade``
with ``takeover``, so it delivers webhooks) on the database ``argv[1]``, letting webhooks
reach loopback over http, serving nothing else until it is killed."""

from __future__ import annotations

import asyncio
import sys

from cleveragents.acp.facade.factory import open_facade
from tests.facade.webhooks.helpers import LOOPBACK_POLICY


async def main(db: str) -> None:
    facade = open_facade(db, policy=LOOPBACK_POLICY, follow=True, takeover=True)
    facade.start()
    print("ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await facade.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
