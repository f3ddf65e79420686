"""A call the server cut because it is stopping: what its caller is told, on every wire.

A draining server stops taking calls at once, lets those under way finish within its grace
period, and answers whatever is still running then with INVALID_STATE, refinement
``SERVER_STOPPING``, saying in ``details.effect`` whether the call took effect:

- ``none``: it did not; ``retryable`` (another server, or this one restarted, runs it);
- ``applied``: it did (its request id's record is stored); a retry with the same request id
  is answered from that record and does nothing twice;
- ``unknown``: the server cannot tell (no request id to look up, work that runs on past
  its caller, a store it could not read); a retry with the same request id is still safe.
"""

from __future__ import annotations

from typing import Literal

from cleveragents.acp.contract.errors import ACPError, ErrorCode

Effect = Literal["none", "applied", "unknown"]

REFINEMENT = "SERVER_STOPPING"

_SAID: dict[str, str] = {
    "none": "the server is stopping and cut {op} before it took effect; send it again",
    "applied": (
        "{op} took effect, but the server is stopping and cut it before it answered; "
        "a retry with the same request id gets its answer without acting twice"
    ),
    "unknown": (
        "the server is stopping and cut {op} while it ran; whether it took effect is not known: "
        "a retry with the same request id gets its answer without acting twice"
    ),
}


def server_stopping(operation: str, request_id: str, effect: Effect) -> ACPError:
    return ACPError(
        ErrorCode.INVALID_STATE,
        _SAID[effect].format(op=operation or "the call"),
        {"effect": effect, "retryable": effect == "none", "operation": operation, "request_id": request_id},
        refinement=REFINEMENT,
    )
