"""Expected revisions: a mutation of one session or plan may name the revision its caller
read (``CallContext.if_revision``, from the envelope's ``if_revision``, gRPC metadata
``acp-if-revision``, HTTP ``If-Match`` or the in-process client's option).

One rule for every object: the check is the store's compare-and-set inside the mutation's
own write transaction (``store.update(record, expected_revision=...)``), never a read
before it, so of two writers holding the same revision exactly one commits. A stale one
is INVALID_STATE with the refinement REVISION_MISMATCH and changes nothing.
"""

from __future__ import annotations

from cleveragents.acp.contract.call import CallContext
from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.contract.revisions import REVISION_MISMATCH


def mismatch(kind: str, id: str, expected: int, actual: int | None) -> ACPError:
    """The refusal of a stale expected revision (``actual`` None: the object went away)."""
    now = "was deleted" if actual is None else f"is at revision {actual}"
    return ACPError(
        ErrorCode.INVALID_STATE,
        f"{kind} {id} {now}, not the expected revision {expected}; read it again",
        {f"{kind}_id": id, "expected": expected, "actual": actual if actual is not None else 0},
        refinement=REVISION_MISMATCH,
    )


def check(ctx: CallContext, kind: str, id: str, actual: int) -> int:
    """The revision the mutation must find when it writes: the caller's expected one, after
    refusing it when the record read in the same transaction is already elsewhere."""
    expected = ctx.if_revision
    if expected is None:
        return actual
    if expected != actual:
        raise mismatch(kind, id, expected, actual)
    return expected
