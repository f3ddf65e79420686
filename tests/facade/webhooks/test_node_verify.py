"""docs/webhooks.md's Node example, run as written: its ```js block (the npm
``standardwebhooks`` package, an Express handler) verifies a real signed delivery and
refuses it tampered. Express itself is stood in for by the few lines the snippet uses
(``express.raw``, ``app.post``, ``res.sendStatus``): the raw body reaches the handler as a
Buffer, as ``express.raw`` gives it. ``make test`` installs the package
(.build/standardwebhooks); without it or Node the test skips loudly (fails under CI=true)."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import shutil

from cleveragents.acp.contract.acp_client import ACPClient
from cleveragents.acp.facade.service_facade import ServiceFacade
from tests.facade.webhooks.helpers import event_log, log_events
from tests.facade.webhooks.receiver import Receiver
from tests.needs import ROOT, unavailable

PACKAGES = pathlib.Path(
    os.environ.get("ACP_STANDARDWEBHOOKS_NODE", ROOT / ".build" / "standardwebhooks" / "node_modules")
)

# What the snippet takes from Express, and one request through its handler per case.
PRELUDE = """
import { readFileSync } from "node:fs";
const delivery = JSON.parse(readFileSync(process.argv[2], "utf8"));
const results = [];
let current;
const express = { raw: (options) => options };
const handle = (event) => { current.event = event; };
const app = {
  post(path, raw, handler) {
    for (const body of [delivery.body, delivery.tampered]) {
      current = { path, raw, status: 0 };
      handler({ body: Buffer.from(body, "utf8"), headers: delivery.headers },
        { sendStatus: (status) => { current.status = status; } });
      results.push(current);
    }
  },
};
process.on("exit", () => console.log(JSON.stringify(results)));
"""


def node_snippet() -> str:
    blocks = re.findall(r"```js\n(.*?)```", (ROOT / "docs" / "webhooks.md").read_text(), re.DOTALL)
    assert len(blocks) == 1, "docs/webhooks.md has one Node example"
    assert 'new Webhook("whsec_...")' in blocks[0]
    return str(blocks[0])


async def test_the_docs_node_example_verifies_a_real_delivery(
    served: tuple[ServiceFacade, ACPClient], tmp_path: pathlib.Path
) -> None:
    node = shutil.which("node")
    if node is None or not (PACKAGES / "standardwebhooks").is_dir():
        unavailable(f"Node and the npm standardwebhooks package (make test installs it at {PACKAGES})")
    facade, client = served
    async with Receiver() as receiver:
        added = await client.ops.webhook.add(name="hook", url=receiver.url())
        await event_log(facade).append(log_events(1))
        await receiver.wait_for(lambda: len(receiver.requests) >= 1)
    got = receiver.requests[0]
    body = got.body.decode()
    (tmp_path / "node_modules").symlink_to(PACKAGES, target_is_directory=True)
    script = tmp_path / "receiver.mjs"
    script.write_text(PRELUDE + node_snippet().replace("whsec_...", added.secret))
    delivery = tmp_path / "delivery.json"
    delivery.write_text(
        json.dumps({"body": body, "tampered": body.replace("m0", "m9"), "headers": got.headers})
    )
    process = await asyncio.create_subprocess_exec(
        node,
        str(script),
        str(delivery),
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), 60)
    assert process.returncode == 0, err.decode()
    genuine, tampered = json.loads(out)
    assert genuine["status"] == 204, genuine
    assert genuine["event"] == json.loads(body)
    assert genuine["path"] == "/hook"
    assert tampered["status"] == 400, tampered
    assert "event" not in tampered
