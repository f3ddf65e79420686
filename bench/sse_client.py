"""SSE subscribers for the stream figures, run in processes of their own.

``python -m bench.sse_client SPEC_JSON`` opens ``connections`` HTTP/1.1 streams on bare
asyncio sockets, reads each until it has ``events`` frames (counted by their ``id:``
line, cheap enough that the client is not what is measured) or the timeout, and prints
one ``bench-result {json}`` line: per connection, when its request went out, when its
last event came, and how many it got (wall-clock times, comparable across processes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from bench.load import RESULT

MARK = b"\nid: "


async def _subscribe(spec: dict[str, Any], deadline: float) -> dict[str, Any]:
    url = urlsplit(spec["url"])
    host, port = url.hostname or "127.0.0.1", url.port or 80
    started = time.time()
    reader, writer = await asyncio.open_connection(host, port)
    target = url.path + (f"?{url.query}" if url.query else "")
    head = f"GET {target} HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n"
    head += "".join(f"{key}: {value}\r\n" for key, value in spec["headers"].items())
    writer.write((head + "\r\n").encode())
    count = 0
    status = 0
    tail = b""
    ended = started
    try:
        async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
            headers = await reader.readuntil(b"\r\n\r\n")
            status = int(headers.split(b" ", 2)[1])
            while status == 200 and count < spec["events"]:
                chunk = await reader.read(1 << 16)
                if not chunk:
                    break
                window = tail + chunk
                count += window.count(MARK)
                tail = window[-(len(MARK) - 1) :]
                ended = time.time()
    except TimeoutError:
        pass
    finally:
        writer.close()
    return {"started": started, "ended": ended, "events": count, "status": status}


async def _main(spec: dict[str, Any]) -> list[dict[str, Any]]:
    deadline = time.monotonic() + spec["timeout"]
    return list(await asyncio.gather(*(_subscribe(spec, deadline) for _ in range(spec["connections"]))))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sse_client")
    parser.add_argument("spec")
    args = parser.parse_args(argv)
    print(RESULT + json.dumps(asyncio.run(_main(json.loads(args.spec)))), flush=True)


if __name__ == "__main__":
    main()
