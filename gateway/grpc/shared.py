"""The bytes of a gRPC stream's items, made once per item object while several streams of
the operation are open.

The event log hands the same response object to every subscriber of an event (the handler
wraps each event once while several are attached); gRPC serialized it again for each of
them. As the SSE frame cache does (contract/sse.py), the serializer keeps the bytes by the
item's identity (the entry holds the item, so its id names nothing else). With one stream
open nobody shares an item, so nothing is looked up or kept.
"""

from __future__ import annotations

import collections

from google.protobuf import message

from cleveragents.acp.contract.recent import Recent

# Items kept per operation (per generation of the cache): an event's subscribers send it
# within moments of each other.
CACHE_SIZE = 2048

# gRPC streams open per operation.
OPEN: collections.Counter[str] = collections.Counter()


class StreamSerializer:
    """``response_serializer`` of one operation's stream handler."""

    __slots__ = ("kept", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self.kept: Recent[int, tuple[message.Message, bytes]] = Recent(CACHE_SIZE)

    def __call__(self, item: message.Message) -> bytes:
        if OPEN[self.name] < 2:
            return item.SerializeToString()
        found = self.kept.get(id(item))
        if found is not None and found[0] is item:
            return found[1]
        data = item.SerializeToString()
        self.kept.put(id(item), (item, data))
        return data
