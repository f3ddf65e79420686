"""The webhook operations in the contract suite (ACP 1.3): their subjects for the auth and
version matrices (``webhook_subjects``), what their successes must answer
(``WEBHOOK_CHECKS``), the errors only their domain rules give (``WEBHOOK_DOMAIN``), and a
scenario provoking each of those on every transport. Backends deliver nothing (no
deliverer runs in them): the suite covers the operations, tests/facade/webhooks the
deliveries."""

from __future__ import annotations

from typing import Any

from cleveragents.acp.client.acp_client import ACPClient
from tests.conformance.harness import Run
from tests.conformance.scenarios import MISSING_ID, scenario

# Loopback, allowed by the backends' policy; nothing listens on the discard port.
WEBHOOK_URL = "http://127.0.0.1:9/hook"
_OWNED = ("show", "update", "remove", "rotate_secret", "test", "replay", "deliveries")

WEBHOOK_DOMAIN: dict[str, list[tuple[str, str | None]]] = {
    **{f"webhook.{verb}": [("NOT_FOUND", "WEBHOOK_NOT_FOUND")] for verb in _OWNED},
    "webhook.add": [
        ("ALREADY_EXISTS", "WEBHOOK_ALREADY_EXISTS"),
        ("INVALID_PARAMS", "WEBHOOK_ADDRESS_REFUSED"),
        ("INVALID_PARAMS", "WEBHOOK_URL_INVALID"),
    ],
}
WEBHOOK_DOMAIN["webhook.update"] = [*WEBHOOK_DOMAIN["webhook.update"], ("INVALID_STATE", None)]
WEBHOOK_DOMAIN["webhook.remove"] = [*WEBHOOK_DOMAIN["webhook.remove"], ("INVALID_STATE", None)]

Params = dict[str, Any]


async def webhook_subjects(alice: ACPClient, who: str) -> dict[str, Params]:
    """``who``'s own subscriptions to add, update and remove; the others use the world's."""
    own: dict[str, Params] = {"webhook.add": {"name": f"{who}-wh", "url": WEBHOOK_URL}}
    for verb in ("update", "remove"):
        await alice.call("webhook.add", name=f"{who}-wh-{verb}", url=WEBHOOK_URL)
        own[f"webhook.{verb}"] = {"name": f"{who}-wh-{verb}"}
    own["webhook.update"].update(revision=1, description="changed", update_mask="description")
    own["webhook.rotate_secret"] = {"overlap_seconds": 600}
    return own


def _webhook(data: Params, params: Params) -> bool:
    hook = data["webhook"]
    return bool(
        (hook["name"], hook["meta"]["namespace"], hook["url"]) == (params["name"], "default", WEBHOOK_URL)
    )


WEBHOOK_CHECKS: dict[str, Any] = {
    "webhook.add": lambda p, d, w: (
        _webhook(d, p) and d["secret"].startswith("whsec_") and d["webhook"]["enabled"]
    ),
    "webhook.list": lambda p, d, w: "w" in {h["name"] for h in d["webhooks"]},
    "webhook.show": lambda p, d, w: _webhook(d, p) and "secret" not in d,
    "webhook.update": lambda p, d, w: _webhook(d, p) and d["webhook"]["revision"] == 2,
    "webhook.remove": lambda p, d, w: _webhook(d, p),
    "webhook.rotate_secret": lambda p, d, w: (
        _webhook(d, p)
        and d["secret"].startswith("whsec_")
        and bool(d["webhook"]["previous_secret_expire_time"])
    ),
    "webhook.test": lambda p, d, w: (
        d["delivery"]["event_type"] == "webhook.test"
        and d["delivery"]["result"] == "WEBHOOK_DELIVERY_RESULT_FAILED"
        and d["delivery"]["response_code"] == 0
    ),
    "webhook.replay": lambda p, d, w: _webhook(d, p) and d["webhook"]["health"]["cursor"] == "0",
    "webhook.deliveries": lambda p, d, w: all(h["delivery_id"] for h in d["deliveries"]),
}


@scenario("webhooks")
async def webhooks(run: Run) -> None:
    """Each webhook operation's domain refusals, and its required fields."""
    alice = run.client()
    added = await alice.call("webhook.add", name="hook", url=WEBHOOK_URL, labels={"team": "a"})
    assert added.secret.startswith("whsec_")  # type: ignore[attr-defined]
    await run.fails(
        alice.call("webhook.add", name="hook", url=WEBHOOK_URL), "ALREADY_EXISTS", "WEBHOOK_ALREADY_EXISTS"
    )
    for url, refinement in (
        ("http://169.254.169.254/latest/meta-data/", "WEBHOOK_ADDRESS_REFUSED"),
        ("http://10.0.0.1/hook", "WEBHOOK_ADDRESS_REFUSED"),
        ("ftp://127.0.0.1/hook", "WEBHOOK_URL_INVALID"),
    ):
        await run.fails(alice.call("webhook.add", name="ssrf", url=url), "INVALID_PARAMS", refinement)
    for verb in _OWNED:
        fields: Params = {"name": "missing"}
        if verb == "update":
            fields.update(revision=1, description="x", update_mask="description")
        if verb == "replay":
            fields["from_sequence"] = 1
        await run.fails(alice.call(f"webhook.{verb}", **fields), "NOT_FOUND", "WEBHOOK_NOT_FOUND")
        await run.fails(alice.call(f"webhook.{verb}"), "INVALID_PARAMS")
    await run.fails(alice.call("webhook.add", url=WEBHOOK_URL), "INVALID_PARAMS")
    await run.fails(alice.call("webhook.list", page_token=MISSING_ID), "INVALID_PARAMS")
    await run.fails(
        alice.call("webhook.update", name="hook", revision=5, description="x", update_mask="description"),
        "INVALID_STATE",
    )
    await run.fails(alice.call("webhook.remove", name="hook", revision=5), "INVALID_STATE")
    listed = await alice.call("webhook.list", labels={"team": "a"})
    assert [h.name for h in listed.webhooks] == ["hook"]  # type: ignore[attr-defined]
    removed = await alice.call("webhook.remove", name="hook", revision=1)
    assert removed.webhook.name == "hook"  # type: ignore[attr-defined]
