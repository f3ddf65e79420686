"""Rollback: restore the checkpoint apply took, refusing when files changed since."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from cleveragents.acp.contract.errors import ACPError, ErrorCode
from cleveragents.acp.facade.domain.plans import fsat
from cleveragents.acp.facade.domain.plans.records import CheckpointEntry


def changed_since(entries: Sequence[CheckpointEntry]) -> list[str]:
    """Paths whose current content is no longer what apply wrote."""
    changed: list[str] = []
    for entry in entries:
        try:
            with fsat.open_root(entry.root) as root_fd:
                current = fsat.read(root_fd, entry.path).content
        except FileNotFoundError:
            current = None
        digest = hashlib.sha256(current).hexdigest() if current is not None else ""
        if (current is not None) != entry.post_exists or digest != entry.post_sha256:
            changed.append(entry.path)
    return changed


def check(plan_id: str, entries: Sequence[CheckpointEntry], *, force: bool) -> None:
    """INVALID_STATE listing the paths changed since apply, unless ``force``."""
    changed = changed_since(entries)
    if changed and not force:
        raise ACPError(
            ErrorCode.INVALID_STATE,
            f"{len(changed)} file(s) changed since apply: {', '.join(changed)}; "
            "rollback with force to restore them anyway",
            {"plan_id": plan_id, "paths": changed},
        )
