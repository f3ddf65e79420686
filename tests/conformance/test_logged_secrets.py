"""Everything the contract suite's servers logged (one access line per call and per stream,
and any other record) holds none of the secrets the suite used: tokens, stream tickets,
Authorization headers, a model's API key."""

from __future__ import annotations

import re

import orjson
import pytest

from tests.conformance import logged
from tests.facade.plans.model_world import KEY
from tests.server_process import Tokens

TICKET = re.compile(r"acpt_[A-Za-z0-9_-]{8,}")


@pytest.mark.contract_summary
def test_nothing_logged_holds_a_secret(tokens: Tokens) -> None:
    lines = logged.lines()
    access = [orjson.loads(line) for line in lines if '"operation"' in line]
    operations = {line["operation"] for line in access}
    assert len(operations) >= 20, f"the suite's servers logged too little to search: {sorted(operations)}"
    assert {"events.ticket", "events.subscribe"} <= operations
    assert {"envelope", "rest", "grpc"} <= {line["transport"] for line in access}
    secrets = {**tokens.tokens, "model key": KEY}
    text = "\n".join(lines)
    for name, secret in secrets.items():
        assert secret not in text, f"the {name} secret was logged"
    assert not TICKET.search(text), "a stream ticket was logged"
    assert "Bearer " not in text
